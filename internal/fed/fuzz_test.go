package fed

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzDecodeEnvelope: the decoder never panics, and what it accepts survives a round trip
// (the same envelope re-encoded decodes to the same value).
func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte(`{"v":2,"id":"0190b6b4-7a1e-7000-8000-000000000001","principal":{"kind":"session","harness":"claude","session_id":"s","name":"n"},"to":{"ref":"svc:bot"},"body":"hi","push_replies":true,"thread_id":"0190b6b4-7a1e-7000-8000-000000000001","created_at":1}`))
	f.Add([]byte(`{"v":2,"principal":{"kind":"anonymous","from":"x"},"to":{"ref":"a@b"}}`))
	f.Add([]byte(`{"v":1,"principal":{"kind":"service","name":"bot","extra":1}}`))
	f.Add([]byte("{\"body\":\"\xff\"}"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		e, err := DecodeEnvelope(raw)
		if err != nil {
			return
		}
		again, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		e2, err := DecodeEnvelope(again)
		if err != nil {
			t.Fatalf("re-encoded envelope refused: %v\n%s", err, again)
		}
		if e2 != e {
			t.Fatalf("round trip changed the envelope: %+v → %+v", e, e2)
		}
		_ = e.Principal.Check()
	})
}

// FuzzDecodeReply: as FuzzDecodeEnvelope, for reply envelopes.
func FuzzDecodeReply(f *testing.F) {
	f.Add([]byte(`{"v":2,"id":"0190b6b4-7a1e-7000-8000-000000000002","in_reply_to":"0190b6b4-7a1e-7000-8000-000000000001","replier":{"harness":"svc","session_id":"svc:bot","name":"bot"},"text":"pong","created_at":2}`))
	f.Add([]byte(`{"v":2,"replier":{"harness":"svc","extra":1}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		e, err := DecodeReply(raw)
		if err != nil {
			return
		}
		again, _ := json.Marshal(e)
		if e2, err := DecodeReply(again); err != nil || e2 != e {
			t.Fatalf("round trip: %+v → %+v, %v", e, e2, err)
		}
	})
}

// FuzzParsePeers: the parser never panics, and every accepted peer satisfies the rules the
// verifier relies on (exactly one trust kind, a host:port address, valid patterns).
func FuzzParsePeers(f *testing.F) {
	f.Add([]byte(`{"b":{"address":"192.0.2.2:7443","pin":"` + pinA + `","allow":["send"],"from":["192.0.2.0/24"]}}`))
	f.Add([]byte(`{"peers":{"b":{"address":"h:1","ca":"fed-ca","identities":["spiffe://x/*"],"targets":[]}}}`))
	f.Add([]byte(`[{"name":"b","address":"h:1","pin":"` + pinA + `","principals":["anon:x"],"leaf":true}]`))
	f.Add([]byte(`{"b":{"address":"h:1","no_whois":true}}`))
	ca := []byte(`-----BEGIN CERTIFICATE-----
MIIBHDCBz6ADAgECAgEBMAUGAytlcDAPMQ0wCwYDVQQDEwRyb290MB4XDTI0MDEwMTAwMDAwMFoXDTM0MDEwMTAwMDAwMFowDzENMAsGA1UEAxMEcm9vdDAqMAUGAytlcAMhAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuGo0IwQDAOBgNVHQ8BAf8EBAMCAgQwDwYDVR0TAQH/BAUwAwEB/zAdBgNVHQ4EFgQUAAAAAAAAAAAAAAAAAAAAAAAAAAAwBQYDK2VwA0EA
-----END CERTIFICATE-----
`)
	f.Fuzz(func(t *testing.T, raw []byte) {
		ps, err := ParsePeers(raw, func(string) ([]byte, error) { return ca, nil })
		if err != nil {
			return
		}
		for _, p := range ps.All() {
			if (p.Pin == nil) == (p.CA == nil) {
				t.Fatalf("peer %q: trust kinds pin=%v ca=%v", p.Name, p.Pin != nil, p.CA != nil)
			}
			if p.CA != nil && len(p.Identities) == 0 {
				t.Fatalf("peer %q: CA without identities", p.Name)
			}
			for _, id := range p.Identities {
				if ValidPattern(id) != nil {
					t.Fatalf("peer %q: invalid pattern %q accepted", p.Name, id)
				}
			}
			if p.From != nil && len(p.From) == 0 {
				t.Fatalf("peer %q: empty from accepted", p.Name)
			}
			if !ValidPeerName(p.Name) {
				t.Fatalf("peer name %q accepted", p.Name)
			}
		}
	})
}

// FuzzMatchIdentity: a wildcard pattern never matches a URI that leaves its prefix or holds
// a dot segment, an empty segment, '?' or '#'; an exact pattern matches only itself.
func FuzzMatchIdentity(f *testing.F) {
	f.Add("spiffe://example.org/node/*", "spiffe://example.org/node/a")
	f.Add("spiffe://example.org/node/*", "spiffe://example.org/node/../admin")
	f.Add("spiffe://example.org/node/a", "spiffe://example.org/node/a")
	f.Add("urn:x:*", "urn:x:y")
	f.Fuzz(func(t *testing.T, pattern, uri string) {
		if ValidPattern(pattern) != nil {
			return
		}
		if !MatchIdentity(pattern, uri) {
			return
		}
		base, wild := strings.CutSuffix(pattern, "/*")
		if !wild {
			if uri != pattern {
				t.Fatalf("exact %q matched %q", pattern, uri)
			}
			return
		}
		rest, ok := strings.CutPrefix(uri, base+"/")
		if !ok || rest == "" || strings.ContainsAny(rest, "?#") || strings.HasSuffix(rest, "/") {
			t.Fatalf("%q matched %q", pattern, uri)
		}
		for _, seg := range strings.Split(rest, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("%q matched %q (segment %q)", pattern, uri, seg)
			}
		}
	})
}
