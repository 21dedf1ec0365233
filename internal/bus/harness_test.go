package bus

import (
	"context"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/ledger"
)

// zed is a harness of the test's own: uid-admitted and queued, with an envelope of its own.
// This is all that adding a harness takes (one with the plain envelope is one Spec value).
type zed struct{ harness.Spec }

func (zed) Envelope(_, _, plain string) string { return "[zed] " + plain }

var zedHarness = zed{harness.Spec{ID: "zed", Prefixes: []string{"zed", "z"}, Admit: harness.UID, Deliver: harness.Queue, Order: 1}}

// TestOwnHarness: a harness registered by a test is admitted on uid, resolved by its
// prefixes, listed, queued to with its own envelope, polled and acknowledged once; a bus
// without it refuses the same registration.
func TestOwnHarness(t *testing.T) {
	hs, err := harness.NewRegistry(append(Builtin(), zedHarness)...)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := newBusWith(t, func(c *Config) { c.Harnesses = hs })
	ctx := context.Background()
	r, err := b.RegisterSession("zed", "zz", "/w", self(), "")
	if err != nil || !strings.HasPrefix(r.SessionID, "zed:") {
		t.Fatalf("register zed = %+v, %v", r, err)
	}
	var listed bool
	for _, v := range b.Sessions("", "") {
		listed = listed || (v.Harness == "zed" && v.SessionID == r.SessionID && v.Kind == "interactive")
	}
	if !listed {
		t.Fatalf("zed session not listed: %+v", b.Sessions("", ""))
	}
	for _, ref := range []string{"z:zz", "zed:zz", r.SessionID} {
		d, err := b.Send(ctx, Send{To: envelope.ParseRef(ref), Text: "hello " + ref, Bytes: 1, FromName: "a", Principal: "p"})
		if err != nil || d.Outcome.String() != "delivered" || d.SessionID != r.SessionID {
			t.Fatalf("send to %s = %+v, %v", ref, d, err)
		}
		p, err := b.Poll(ctx, r, 0)
		if err != nil || p == nil || p.ID != d.MessageID || !strings.HasPrefix(p.Envelope, "[zed] ") {
			t.Fatalf("poll after send to %s = %+v, %v", ref, p, err)
		}
		if err := b.Ack(context.Background(), r, p.ID); err != nil {
			t.Fatal(err)
		}
		if p, _ := b.Poll(ctx, r, 0); p != nil {
			t.Fatalf("poll after ack = %+v, want nothing (delivered once)", p)
		}
	}
	// A prefix pins the harness: "pi:zz" is not the zed session.
	if _, err := b.Resolve("pi:zz"); AsError(err).Code != ledger.NotFound {
		t.Fatalf("Resolve(pi:zz) = %v, want not_found", err)
	}
	plain, _ := newBus(t)
	if _, err := plain.RegisterSession("zed", "zz", "/", self(), ""); AsError(err).Code != ledger.BadRequest {
		t.Fatalf("register zed on a bus without it = %v, want bad_request", err)
	}
}
