package principal

import (
	"errors"
	"testing"
)

// TestSender: a peer's principal becomes a sender named under the PEER's name, never its
// own claim about a host; each kind keeps only what it may (an anonymous sender gets no
// return address), and what is not valid is refused.
func TestSender(t *testing.T) {
	for _, tc := range []struct {
		p          Principal
		from, badg string
		ret        *Return
	}{
		{Principal{Kind: Session, Harness: "claude", SessionID: "s-1", Name: "alice"}, "xmsg@a \u00b7 claude:alice", "claude:alice",
			&Return{Harness: "claude", SessionID: "s-1", Name: "alice"}},
		{Principal{Kind: Session, Harness: "pi", SessionID: "p-1"}, "xmsg@a \u00b7 pi:p-1", "pi:p-1", &Return{Harness: "pi", SessionID: "p-1", Name: "p-1"}},
		{Principal{Kind: Service, Name: "matrix"}, "xmsg@a \u00b7 svc:matrix", "svc:matrix", &Return{Harness: "svc", SessionID: "svc:matrix", Name: "matrix"}},
		{Principal{Kind: Anonymous, From: "bob"}, "xmsg@a \u00b7 bob", "anon:bob", nil},
	} {
		s, err := tc.p.Sender("a")
		if err != nil || s.FromName != tc.from || s.Badge != tc.badg || (s.Return == nil) != (tc.ret == nil) || (s.Return != nil && *s.Return != *tc.ret) {
			t.Errorf("%+v.Sender = %+v %v; want %q %q %+v", tc.p, s, err, tc.from, tc.badg, tc.ret)
		}
	}
	for _, bad := range []Principal{
		{Kind: Session, Harness: "codex", SessionID: "x"}, // no federation principal of its own kind
		{Kind: Session, Harness: "claude"},
		{Kind: Session, Harness: "claude", SessionID: "a b"},
		{Kind: Service, Name: "a/b"},
	} {
		if _, err := bad.Sender("a"); err == nil || errors.Is(err, ErrSender) {
			t.Errorf("%+v.Sender accepted, or called it a bad sender: %v", bad, err)
		}
	}
	if _, err := (Principal{Kind: Anonymous, From: "a:b"}).Sender("a"); !errors.Is(err, ErrSender) {
		t.Errorf("anonymous a:b = %v, want ErrSender", err)
	}
}

// TestCheck: a field of another kind is refused like an unknown one.
func TestCheck(t *testing.T) {
	for _, ok := range []Principal{{Kind: Session, Harness: "claude", SessionID: "x", Name: "n"}, {Kind: Service, Name: "x"}, {Kind: Anonymous, From: "x"}} {
		if err := ok.Check(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	for _, bad := range []Principal{{Kind: Session, From: "x"}, {Kind: Service, Name: "x", SessionID: "y"}, {Kind: Anonymous, Name: "x"}, {Kind: "robot"}} {
		if err := bad.Check(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
