package fed

import (
	"crypto/x509"
	"errors"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/fed/fedtest"
)

func TestPatterns(t *testing.T) {
	for _, p := range []string{"spiffe://example.org/node/a", "spiffe://example.org/node/*", "spiffe://example.org/*", "urn:xmsg:node-a", "spiffe://example.org"} {
		if err := ValidPattern(p); err != nil {
			t.Errorf("ValidPattern(%q) = %v, want ok", p, err)
		}
	}
	for _, p := range []string{"", "*", "/*", "spiffe://example.org/*/a", "spiffe://example.org/a*", "spiffe://example.org/node/", "spiffe://example.org/node//*",
		"spiffe://example.org/a?b", "spiffe://example.org/a#b", "spiffe://example.org/./a", "spiffe://example.org/../a", "spiffe://example.org//a", "relative/path", "spiffe://example.org/%2e%2e/a"} {
		if err := ValidPattern(p); err == nil {
			t.Errorf("ValidPattern(%q) accepted", p)
		}
	}
	for _, tt := range []struct {
		pattern, uri string
		want         bool
	}{
		{"spiffe://x/node/a", "spiffe://x/node/a", true},
		{"spiffe://x/node/a", "spiffe://x/node/ab", false},
		{"spiffe://x/node/a", "spiffe://x/node/a/b", false},
		{"spiffe://x/node/*", "spiffe://x/node/a", true},
		{"spiffe://x/node/*", "spiffe://x/node/a/b", true},
		{"spiffe://x/node/*", "spiffe://x/node", false},
		{"spiffe://x/node/*", "spiffe://x/node/", false},
		{"spiffe://x/node/*", "spiffe://x/nodes/a", false},
		{"spiffe://x/node/*", "spiffe://x/node/a/", false},
		{"spiffe://x/node/*", "spiffe://x/node//a", false},
		{"spiffe://x/node/*", "spiffe://x/node/./a", false},
		{"spiffe://x/node/*", "spiffe://x/node/../admin", false},
		{"spiffe://x/node/*", "spiffe://x/node/%2e%2e", false},
		{"spiffe://x/node/*", "spiffe://x/node/a?x=1", false},
		{"spiffe://x/node/*", "spiffe://x/node/a#f", false},
		{"spiffe://x/node/*", "SPIFFE://x/node/a", false},
	} {
		if got := MatchIdentity(tt.pattern, tt.uri); got != tt.want {
			t.Errorf("MatchIdentity(%q, %q) = %v, want %v", tt.pattern, tt.uri, got, tt.want)
		}
	}
}

// world is a set of certificates and a peers file over them.
type world struct {
	ca, otherCA                       *fedtest.Cert
	pinned, outbound, caLeaf, twoSANs *fedtest.Cert
	wrongSAN, foreign, stranger, both *fedtest.Cert
	peers                             *Peers
}

func newWorld(t *testing.T) *world {
	w := &world{}
	w.ca = fedtest.New(t, "ca", nil, fedtest.Options{CA: true})
	w.otherCA = fedtest.New(t, "other-ca", nil, fedtest.Options{CA: true})
	w.pinned = fedtest.New(t, "pinned", nil, fedtest.Options{})
	w.outbound = fedtest.New(t, "outbound", nil, fedtest.Options{})
	w.caLeaf = fedtest.New(t, "c1", w.ca, fedtest.Options{URIs: []string{"spiffe://example.org/node/c1"}})
	w.twoSANs = fedtest.New(t, "c2", w.ca, fedtest.Options{URIs: []string{"spiffe://example.org/node/c2", "spiffe://example.org/node/c3"}})
	w.wrongSAN = fedtest.New(t, "c4", w.ca, fedtest.Options{URIs: []string{"spiffe://example.org/admin/c4"}})
	w.foreign = fedtest.New(t, "c5", w.otherCA, fedtest.Options{URIs: []string{"spiffe://example.org/node/c5"}})
	w.stranger = fedtest.New(t, "stranger", nil, fedtest.Options{})
	// Issued by the CA with a matching SAN AND pinned by another peer.
	w.both = fedtest.New(t, "both", w.ca, fedtest.Options{URIs: []string{"spiffe://example.org/node/both"}})
	raw := `{
	  "pinned":   {"address": "192.0.2.2:7443", "pin": "` + w.pinned.Pin + `", "allow": ["send"]},
	  "outbound": {"address": "192.0.2.3:7443", "pin": "` + w.outbound.Pin + `"},
	  "bothpin":  {"address": "192.0.2.4:7443", "pin": "` + w.both.Pin + `", "allow": ["send"]},
	  "cluster":  {"address": "192.0.2.5:7443", "ca": "ca.pem", "identities": ["spiffe://example.org/node/*"], "allow": ["send"]}
	}`
	var err error
	w.peers, err = ParsePeers([]byte(raw), func(string) ([]byte, error) { return w.ca.CertPEM, nil })
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestInbound(t *testing.T) {
	w := newWorld(t)
	chain := func(cs ...*fedtest.Cert) []*x509.Certificate {
		var out []*x509.Certificate
		for _, c := range cs {
			out = append(out, c.Cert)
		}
		return out
	}
	for _, tt := range []struct {
		name  string
		chain []*x509.Certificate
		peer  string // "" = refused
		why   string
	}{
		{"pin", chain(w.pinned), "pinned", ""},
		{"ca", chain(w.caLeaf), "cluster", ""},
		{"ca with the CA sent along", chain(w.caLeaf, w.ca), "cluster", ""},
		{"unknown pin", chain(w.stranger), "", "unknown certificate"},
		{"outbound-only", chain(w.outbound), "", "outbound-only"},
		{"pin and CA both", chain(w.both), "", "matches pinned peer \"bothpin\" and CA peer \"cluster\""},
		{"wrong SAN", chain(w.wrongSAN), "", "unknown certificate"},
		{"two SANs", chain(w.twoSANs), "", "unknown certificate"},
		{"other CA", chain(w.foreign), "", "unknown certificate"},
		{"no certificate", nil, "", "no client certificate"},
	} {
		p, err := w.peers.Inbound(tt.chain)
		switch {
		case tt.peer != "" && (err != nil || p.Name != tt.peer):
			t.Errorf("%s: got %v %v, want peer %s", tt.name, p, err, tt.peer)
		case tt.peer == "" && (err == nil || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tt.why)):
			t.Errorf("%s: got %v %v, want refusal …%s…", tt.name, p, err, tt.why)
		}
	}
	// Two CA peers accepting the same certificate: refused, not the first one picked.
	ps, err := ParsePeers([]byte(`{
	  "a": {"address": "h:1", "ca": "ca.pem", "identities": ["spiffe://example.org/node/*"], "allow": ["send"]},
	  "b": {"address": "h:2", "ca": "ca.pem", "identities": ["spiffe://example.org/node/c1"], "allow": ["send"]}}`),
		func(string) ([]byte, error) { return w.ca.CertPEM, nil })
	if err != nil {
		t.Fatal(err)
	}
	if p, err := ps.Inbound(chain(w.caLeaf)); err == nil || !strings.Contains(err.Error(), "matches 2 CA peers") {
		t.Errorf("two CA peers: got %v %v", p, err)
	}
}

func TestVerifyServer(t *testing.T) {
	w := newWorld(t)
	pinned, _ := w.peers.Get("pinned")
	cluster, _ := w.peers.Get("cluster")
	if err := pinned.VerifyServer([]*x509.Certificate{w.pinned.Cert}); err != nil {
		t.Errorf("pinned: %v", err)
	}
	if err := pinned.VerifyServer([]*x509.Certificate{w.stranger.Cert}); err == nil {
		t.Error("pinned peer accepted another certificate")
	}
	if err := cluster.VerifyServer([]*x509.Certificate{w.caLeaf.Cert}); err != nil {
		t.Errorf("cluster: %v", err)
	}
	for _, c := range []*fedtest.Cert{w.wrongSAN, w.twoSANs, w.foreign, w.pinned} {
		if err := cluster.VerifyServer([]*x509.Certificate{c.Cert}); err == nil {
			t.Errorf("cluster accepted %s", c.Cert.Subject)
		}
	}
	if err := pinned.VerifyServer(nil); err == nil {
		t.Error("no certificate accepted")
	}
}

func TestParsePin(t *testing.T) {
	c := fedtest.New(t, "n", nil, fedtest.Options{})
	for _, s := range []string{c.Pin, strings.ToUpper(c.Pin), c.Pin[7:], "Sha256:" + strings.ToUpper(c.Pin[7:])} {
		b, err := ParsePin(s)
		if err != nil || "sha256:"+strings.ToLower(c.Pin[7:]) != (&Peer{Pin: b}).PinString() {
			t.Errorf("ParsePin(%q) = %x, %v", s, b, err)
		}
	}
	if p := (&Peer{Pin: SPKIPin(c.Cert)}).PinString(); p != c.Pin {
		t.Errorf("SPKIPin = %s, want %s", p, c.Pin)
	}
}
