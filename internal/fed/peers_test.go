package fed

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/fed/fedtest"
)

const pinA = "sha256:" + "aa00000000000000000000000000000000000000000000000000000000000000"

func noCA(string) ([]byte, error) { return nil, errors.New("no CA files in this test") }

func TestPeersShapes(t *testing.T) {
	for _, raw := range []string{
		`{"b": {"address": "192.0.2.2:7443", "pin": "` + pinA + `", "allow": ["send"]}}`,
		`{"peers": {"b": {"address": "192.0.2.2:7443", "pin": "` + pinA + `", "allow": ["send"]}}}`,
		`[{"name": "b", "address": "192.0.2.2:7443", "pin": "` + pinA + `", "allow": ["send"]}]`,
		// A name inside an entry overrides the key.
		`{"x": {"name": "b", "address": "192.0.2.2:7443", "pin": "` + pinA + `", "allow": ["send"]}}`,
		// The pin's prefix is optional and any case.
		`{"b": {"address": "192.0.2.2:7443", "pin": "` + strings.ToUpper(pinA[7:]) + `", "allow": ["send"]}}`,
		`{"b": {"address": "192.0.2.2:7443", "pin": "SHA256:` + pinA[7:] + `", "allow": ["send"]}}`,
	} {
		ps, err := ParsePeers([]byte(raw), noCA)
		if err != nil {
			t.Errorf("%s: %v", raw, err)
			continue
		}
		p, ok := ps.Get("b")
		if !ok || p.Address != "192.0.2.2:7443" || p.PinString() != pinA || !p.Allow["send"] || len(ps.All()) != 1 {
			t.Errorf("%s: got %+v", raw, p)
		}
	}
	// A peer really called "peers" is a peer, not the wrapper.
	ps, err := ParsePeers([]byte(`{"peers": {"address": "192.0.2.2:7443", "pin": "`+pinA+`"}}`), noCA)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ps.Get("peers"); !ok {
		t.Error("a peer named peers was taken for the wrapper")
	}
}

func TestPeersFields(t *testing.T) {
	raw := `{"b": {"address": "[2001:db8::2]:7443", "pin": "` + pinA + `", "allow": ["send", "reply", "list"],
		"from": ["192.0.2.0/24", "::ffff:198.51.100.7", "2001:db8::/32"], "leaf": true,
		"principals": ["claude:alice", "svc:bot", "anon:x", "session:abc", "agy:a", "pi:p"],
		"targets": []}}`
	ps, err := ParsePeers([]byte(raw), noCA)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := ps.Get("b")
	if !p.Leaf || !p.TargetsSet || len(p.Targets) != 0 || len(p.Principals) != 6 || len(p.AllowList()) != 3 {
		t.Errorf("got %+v", p)
	}
	for addr, want := range map[string]bool{"192.0.2.9": true, "::ffff:192.0.2.9": true, "198.51.100.7": true,
		"198.51.100.8": false, "2001:db8::5": true, "2001:db9::5": false, "203.0.113.1": false} {
		if got := p.SourceAllowed(netip.MustParseAddr(addr)); got != want {
			t.Errorf("SourceAllowed(%s) = %v, want %v", addr, got, want)
		}
	}
	// A leaf needs no address (it is never dialled).
	if _, err := ParsePeers([]byte(`{"l": {"leaf": true, "pin": "`+pinA+`"}}`), noCA); err != nil {
		t.Errorf("leaf without address: %v", err)
	}
	ps, _ = ParsePeers([]byte(`{"b": {"address": "h:1", "pin": "`+pinA+`"}}`), noCA)
	if p, _ := ps.Get("b"); p.From != nil || !p.SourceAllowed(netip.MustParseAddr("203.0.113.1")) || p.TargetsSet || len(p.Allow) != 0 {
		t.Errorf("defaults: %+v", p)
	}
}

func TestPeersLoadErrors(t *testing.T) {
	ca := fedtest.New(t, "ca", nil, fedtest.Options{CA: true})
	leaf := fedtest.New(t, "leaf", nil, fedtest.Options{})
	readCA := func(name string) ([]byte, error) {
		switch name {
		case "ca.pem":
			return ca.CertPEM, nil
		case "leaf.pem":
			return leaf.CertPEM, nil
		case "junk.pem":
			return []byte("not pem"), nil
		}
		return nil, errors.New("no such file")
	}
	pin := `"pin": "` + pinA + `"`
	for _, tt := range []struct{ raw, want string }{
		{`{"b": {"address": "h:1", ` + pin + `, "color": "red"}}`, `peer "b": field "color": unknown field`},
		{`{"b": {"address": "h:1", ` + pin + `, "no_whois": true}}`, `peer "b": field "no_whois": is obsolete; restrict source addresses with "from"`},
		{`[{"name": "b", "address": "h:1", ` + pin + `}, {"name": "b", "address": "h:2", "pin": "` + strings.Replace(pinA, "aa", "bb", 1) + `"}]`, `peer "b": duplicate peer name`},
		{`{"b": {"address": "h:1", ` + pin + `}, "b": {"address": "h:2", ` + pin + `}}`, `peer "b": duplicate peer name`},
		{`{"b": {"address": "h:1", ` + pin + `}, "c": {"address": "h:2", ` + pin + `}}`, `peer "c": field "pin": same pin as peer "b"`},
		{`{"b": {` + pin + `}}`, `peer "b": field "address": missing`},
		{`{"b": {"address": "nohost", ` + pin + `}}`, `peer "b": field "address": "nohost" is not host:port`},
		{`{"b": {"address": "h:99999", ` + pin + `}}`, `peer "b": field "address"`},
		{`{"b": {"address": "h:1"}}`, `peer "b": field "pin": neither "pin" nor "ca" given`},
		{`{"b": {"address": "h:1", ` + pin + `, "ca": "ca.pem", "identities": ["spiffe://x/a"]}}`, `peer "b": field "pin": both "pin" and "ca" given`},
		{`{"b": {"address": "h:1", ` + pin + `, "identities": ["spiffe://x/a"]}}`, `peer "b": field "identities": only with "ca"`},
		{`{"b": {"address": "h:1", "ca": "ca.pem"}}`, `peer "b": field "identities": "ca" needs a non-empty "identities" list`},
		{`{"b": {"address": "h:1", "ca": "ca.pem", "identities": []}}`, `peer "b": field "identities": "ca" needs a non-empty`},
		{`{"b": {"address": "h:1", "ca": "ca.pem", "identities": [""]}}`, `peer "b": field "identities": "": empty pattern`},
		{`{"b": {"address": "h:1", "ca": "ca.pem", "identities": ["spiffe://x/*/a"]}}`, `'*' is allowed only as the final segment`},
		{`{"b": {"address": "h:1", "ca": "ca.pem", "identities": [1]}}`, `peer "b": field "identities": element 0 is not a string`},
		{`{"b": {"address": "h:1", "ca": "leaf.pem", "identities": ["spiffe://x/a"]}}`, `peer "b": field "ca": certificate 1 (CN=leaf) is not a CA`},
		{`{"b": {"address": "h:1", "ca": "junk.pem", "identities": ["spiffe://x/a"]}}`, `peer "b": field "ca": no certificate in the bundle`},
		{`{"b": {"address": "h:1", "ca": "missing.pem", "identities": ["spiffe://x/a"]}}`, `peer "b": field "ca": no such file`},
		{`{"b": {"address": "h:1", "pin": "sha256:abc"}}`, `peer "b": field "pin": want sha256:<64 hex digits>`},
		{`{"b": {"address": "h:1", "pin": "sha256:` + strings.Repeat("zz", 32) + `"}}`, `peer "b": field "pin": want sha256:`},
		{`{"b": {"address": "h:1", ` + pin + `, "allow": ["send", "delete"]}}`, `peer "b": field "allow": unknown operation "delete"`},
		{`{"b": {"address": "h:1", ` + pin + `, "allow": "send"}}`, `peer "b": field "allow": want an array of strings`},
		{`{"b": {"address": "h:1", ` + pin + `, "from": []}}`, `peer "b": field "from": empty list`},
		{`{"b": {"address": "h:1", ` + pin + `, "from": ["192.0.2.0/33"]}}`, `peer "b": field "from": "192.0.2.0/33" is not an IP address or CIDR`},
		{`{"b": {"address": "h:1", ` + pin + `, "from": [7]}}`, `peer "b": field "from": element 0 is not a string`},
		{`{"b": {"address": "h:1", ` + pin + `, "principals": ["alice"]}}`, `peer "b": field "principals": "alice" must be kind-qualified`},
		{`{"b": {"address": "h:1", ` + pin + `, "principals": ["claude:"]}}`, `peer "b": field "principals": "claude:" must be kind-qualified`},
		{`{"b": {"address": "h:1", ` + pin + `, "targets": ["anon:x"]}}`, `peer "b": field "targets": "anon:x" must be kind-qualified`},
		{`{"b": {"address": "h:1", ` + pin + `, "leaf": "yes"}}`, `peer "b": field "leaf": want true or false`},
		{`{"b": {"address": 7, ` + pin + `}}`, `peer "b": field "address": want a string`},
		{`{"b/c": {"address": "h:1", ` + pin + `}}`, `peer "b/c": field "name": must match`},
		{`[{"address": "h:1", ` + pin + `}]`, `entry 0: field "name": missing`},
		{`{"b": "h:1"}`, `peer "b": want an object`},
		{`"b"`, `want a JSON object or array`},
		{`{"b": {"address": "h:1", ` + pin + `}} x`, `trailing data`},
	} {
		_, err := ParsePeers([]byte(tt.raw), readCA)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s:\n got  %v\n want …%s…", tt.raw, err, tt.want)
		}
	}
}

// TestPeersFileBound: the peers file has a bound of its own, not a credential's 1 MiB: one
// entry a leaf, 100,000 leaves of 20-character names and prefixed pins fit, and a file one
// byte over the bound is refused with the bound named. Mutant tried: the peers file read
// under creds.MaxSize: red.
func TestPeersFileBound(t *testing.T) {
	entry := fmt.Sprintf(`"%s": {"pin": "sha256:%064x", "leaf": true},`, strings.Repeat("n", 20), 0)
	if 100000*len(entry)+2 > MaxPeersSize {
		t.Fatalf("100,000 entries of %d bytes do not fit %d bytes", len(entry), MaxPeersSize)
	}
	path := filepath.Join(t.TempDir(), "peers.json")
	for _, size := range []int{MaxPeersSize, MaxPeersSize + 1} {
		if err := os.WriteFile(path, bytes.Repeat([]byte(" "), size), 0o600); err != nil {
			t.Fatal(err)
		}
		in, err := readInputs(Config{PeersPath: path})
		switch {
		case size <= MaxPeersSize && (err != nil || len(in.peers) != size):
			t.Errorf("a peers file of %d bytes: %v", size, err)
		case size > MaxPeersSize && (err == nil || !strings.Contains(err.Error(), "larger than 16777216 bytes (16 MiB), the most the peers credential may hold")):
			t.Errorf("a peers file of %d bytes: %v, want refused naming the bound", size, err)
		}
	}
}

// BenchmarkParsePeersFleet: parsing the peers file of a hub of 10,000 leaves (what a start
// and a reload of a changed file cost).
func BenchmarkParsePeersFleet(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("{")
	for i := range 10000 {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `"leaf-%06d": {"pin": "sha256:%064x", "leaf": true}`, i, i)
	}
	sb.WriteString("}")
	raw := []byte(sb.String())
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := ParsePeers(raw, noCA); err != nil {
			b.Fatal(err)
		}
	}
}
