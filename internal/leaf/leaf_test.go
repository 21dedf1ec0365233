package leaf

import (
	"testing"

	"github.com/xmsg/xmsg/internal/principal"
)

func TestParsePrincipal(t *testing.T) {
	for _, tc := range []struct {
		in      string
		fed     principal.Principal
		service string
	}{
		{"svc:matrix", principal.Principal{Kind: "service", Name: "matrix"}, "matrix"},
		{"matrix", principal.Principal{Kind: "service", Name: "matrix"}, "matrix"},
		{"claude:alice", principal.Principal{Kind: "session", Harness: "claude", SessionID: "alice", Name: "alice"}, "claude:alice"},
		{"agy:x", principal.Principal{Kind: "session", Harness: "agy", SessionID: "x", Name: "x"}, "agy:x"},
		{"pi:p-1", principal.Principal{Kind: "session", Harness: "pi", SessionID: "p-1", Name: "p-1"}, "pi:p-1"},
		{"anon:bob", principal.Principal{Kind: "anonymous", From: "bob"}, "anon:bob"},
	} {
		id, err := ParsePrincipal(tc.in)
		if err != nil || id.Fed != tc.fed || id.Service != tc.service || id.Principal != tc.in {
			t.Errorf("ParsePrincipal(%q) = %+v, %v; want %+v service %q", tc.in, id, err, tc.fed, tc.service)
		}
	}
	for _, bad := range []string{"", "svc:", "svc:a b", "svc:" + string(make([]byte, 33)), "claude:", "x:y", "anon:a:b", "anon:", "a/b", "svc:über"} {
		if _, err := ParsePrincipal(bad); err == nil {
			t.Errorf("ParsePrincipal(%q) accepted", bad)
		}
	}
}
