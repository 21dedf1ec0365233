package bus

import (
	"testing"

	"github.com/xmsg/xmsg/internal/ledger"
)

// TestOfflineServiceByBareName: a configured service that is not connected is addressable by
// its bare name as by svc:<name> (both queue: its queue is durable), as the last step of the
// resolution order: a session of that name (live, or dead: gone) comes first, and a name no
// service has stays not found.
func TestOfflineServiceByBareName(t *testing.T) {
	b, _ := newBus(t)
	for _, ref := range []string{"svc:known", "known", "KNOWN"} {
		tg, err := b.Resolve(ref)
		if err != nil || tg.Harness != "svc" || tg.SessionID != "svc:known" || !tg.Offline {
			t.Errorf("Resolve(%q) = %+v, %v; want the offline svc:known", ref, tg, err)
		}
	}
	if _, err := b.Resolve("unknown"); AsError(err).Code != ledger.NotFound {
		t.Errorf("Resolve(unknown) = %v; want not_found", err)
	}
	// A live pi session named like the service wins the bare name; svc: still pins the service.
	if _, err := b.RegisterSession("pi", "known", "/", self(), ""); err != nil {
		t.Fatal(err)
	}
	if tg, err := b.Resolve("known"); err != nil || tg.Harness != "pi" {
		t.Errorf("Resolve(known) with a pi session of that name = %+v, %v; want the pi session", tg, err)
	}
	if tg, err := b.Resolve("svc:known"); err != nil || tg.SessionID != "svc:known" {
		t.Errorf("Resolve(svc:known) = %+v, %v; want the service", tg, err)
	}
}
