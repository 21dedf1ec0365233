package fed

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/principal"
	"github.com/xmsg/xmsg/internal/store"
)

func p50(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[len(d)/2].Nanoseconds())
}

// BenchmarkLoopback: two in-process nodes on loopback (real mTLS, real stores in the test's
// temporary directory), measured from the bus down, so the federation path can be read
// without the HTTP of the sender's own socket (cmd/xmsg's BenchmarkFederation has that, with
// real daemons in network namespaces):
//
//   - commit: one commit of the sender's store, the baseline;
//   - wire: the envelope alone (fed.Node.Send: the peer's checks, its commit, one round trip);
//   - send: bus.Send of a remote ref, which also records the message on the sender
//     (target: ≤ 1.25 × (2 commits + the round trip), i.e. about 1.25 × (commit + wire)).
func BenchmarkLoopback(b *testing.B) {
	na, nb := benchPair(b)
	ctx := context.Background()
	ack := func(id string) { nb.bus.Ack(context.Background(), &bus.Registration{SessionID: "svc:bot"}, id) } // keep the queue below its limit
	b.Run("commit", func(b *testing.B) {
		var lat []time.Duration
		for i := 0; b.Loop(); i++ {
			t0 := time.Now()
			na.store.Update(func(tx *store.Tx) error { return tx.PutMessage(store.Message{ID: uuid.Must(uuid.NewV7()).String()}) })
			lat = append(lat, time.Since(t0))
		}
		b.ReportMetric(p50(lat), "p50-ns")
	})
	b.Run("wire", func(b *testing.B) {
		var lat []time.Duration
		for b.Loop() {
			id := uuid.Must(uuid.NewV7()).String()
			t0 := time.Now()
			e := Envelope{V: Version, ID: id, Principal: principal.Principal{Kind: principal.Anonymous, From: "x"}, Body: "ping"}
			e.To.Ref = "svc:bot"
			if _, err := na.n.post(ctx, "b", e); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
			b.StopTimer()
			ack(id)
			b.StartTimer()
		}
		b.ReportMetric(p50(lat), "p50-ns")
	})
	b.Run("send", func(b *testing.B) {
		caller := bus.Caller{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
		var lat []time.Duration
		for b.Loop() {
			t0 := time.Now()
			d, err := na.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@b"), Text: "ping", Bytes: 4, FromName: "xmsg@a · svc:bot", Principal: "p", Caller: &caller})
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
			b.StopTimer()
			ack(d.MessageID)
			b.StartTimer()
		}
		b.ReportMetric(p50(lat), "p50-ns")
	})
}
