package harness_test

import (
	"testing"

	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/harness/svc"
	"github.com/xmsg/xmsg/internal/harness/uid"
)

func TestRegistry(t *testing.T) {
	r, err := harness.NewRegistry(svc.Harness, uid.Pi)
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]struct{ h, bare string }{
		"svc:bot": {"svc", "bot"}, "SVC:bot": {"svc", "bot"}, "pi:x": {"pi", "x"},
		"svc:": {"", "svc:"}, "codex:t": {"", "codex:t"}, "bare": {"", "bare"},
	} {
		h, bare := r.Split(ref)
		name := ""
		if h != nil {
			name = h.Name()
		}
		if name != want.h || bare != want.bare {
			t.Errorf("Split(%q) = %q, %q; want %q, %q", ref, name, bare, want.h, want.bare)
		}
	}
	if !r.Is("svc", harness.Exe) || r.Is("pi", harness.Exe) || r.Is("nope", harness.UID) || !r.Delivers("pi", harness.Queue) {
		t.Error("Is/Delivers disagree with the harnesses' facts")
	}
	if _, err := harness.NewRegistry(uid.Pi, uid.New("pi")); err == nil {
		t.Error("a name registered twice was accepted")
	}
	if _, err := harness.NewRegistry(uid.New("svc"), svc.Harness); err == nil {
		t.Error("a ref prefix registered twice was accepted")
	}
}

func TestSpec(t *testing.T) {
	s := harness.Spec{ID: "x"}
	if refs := s.Refs(); len(refs) != 1 || refs[0] != "x" || s.Kind() != "interactive" || s.Envelope("b", "c", "p") != "p" {
		t.Errorf("Spec defaults: refs %v, kind %s", refs, s.Kind())
	}
	if svc.Harness.Kind() != "daemon" || !svc.Harness.Origin() || uid.Pi.Origin() {
		t.Error("svc is listed as a daemon with origins; pi has none")
	}
}
