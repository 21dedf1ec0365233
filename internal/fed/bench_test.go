package fed

import (
	"context"
	"testing"

	"github.com/xmsg/xmsg/internal/bus"
)

// BenchmarkLoopbackSend: a cross-node send between two in-process nodes on loopback (real
// mTLS, real stores), from the bus down: for profiling the federation path alone. The
// namespace benchmark with real daemons is cmd/xmsg's BenchmarkFederation.
func BenchmarkLoopbackSend(b *testing.B) {
	na, nb := benchPair(b)
	ctx := context.Background()
	caller := bus.Caller{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	for b.Loop() {
		d, err := na.bus.Send(ctx, bus.Send{Ref: "svc:bot@b", Text: "ping", Bytes: 4, FromName: "xmsg@a · svc:bot", Principal: "p", Caller: &caller})
		if err != nil {
			b.Fatal(err)
		}
		// Keep b's queue below its limit.
		nb.bus.Ack(&bus.Registration{SessionID: "svc:bot"}, d.MessageID)
	}
}
