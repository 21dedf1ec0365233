package fed

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// SPKIPin is the pin of a certificate: SHA-256 of its SubjectPublicKeyInfo DER (§8.1).
func SPKIPin(c *x509.Certificate) []byte {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return sum[:]
}

// ValidPattern checks an `identities` pattern (§8.1): an exact URI, or "<prefix>/*", which
// matches one or more further path segments. '*' may appear only as that final segment; no
// '?' or '#'; the prefix must not end in '/', and its path must hold no empty, "." or ".."
// segments.
func ValidPattern(p string) error {
	if p == "" {
		return errors.New("empty pattern")
	}
	if strings.ContainsAny(p, "?#") {
		return errors.New("'?' and '#' are not allowed")
	}
	base, _ := strings.CutSuffix(p, "/*")
	if strings.Contains(base, "*") {
		return errors.New("'*' is allowed only as the final segment (\"<prefix>/*\")")
	}
	if base == "" || strings.HasSuffix(base, "/") {
		return errors.New("the prefix must be non-empty and must not end in '/'")
	}
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		return errors.New("not an absolute URI")
	}
	if path := u.EscapedPath(); path != "" && !cleanSegments(strings.TrimPrefix(path, "/")) {
		return errors.New("empty, \".\" or \"..\" path segment")
	}
	return nil
}

// cleanSegments reports whether path (without its leading '/') is one or more non-empty
// segments, none "." or "..", and none containing '?', '#' or '*'.
func cleanSegments(path string) bool {
	if path == "" {
		return false
	}
	for _, seg := range strings.Split(path, "/") {
		if seg == "" || seg == "." || seg == ".." || strings.ContainsAny(seg, "?#*") {
			return false
		}
		// Percent-encoded dots are dots to many URI consumers: refuse them too.
		if d, err := url.PathUnescape(seg); err != nil || d == "." || d == ".." || strings.Contains(d, "/") {
			return false
		}
	}
	return true
}

// MatchIdentity reports whether the URI SAN uri matches pattern (already valid): equal, or
// for "<prefix>/*" beginning with "<prefix>/" followed by one or more clean segments (no
// empty, "." or ".." segment, no '?', '#', no trailing '/').
func MatchIdentity(pattern, uri string) bool {
	base, wild := strings.CutSuffix(pattern, "/*")
	if !wild {
		return uri == pattern && !strings.ContainsAny(uri, "?#")
	}
	rest, ok := strings.CutPrefix(uri, base+"/")
	return ok && cleanSegments(rest)
}

// uriSAN returns the certificate's only URI SAN, or an error if it has none or several.
func uriSAN(c *x509.Certificate) (string, error) {
	if len(c.URIs) != 1 {
		return "", fmt.Errorf("certificate has %d URI SANs, want exactly one", len(c.URIs))
	}
	return c.URIs[0].String(), nil
}

// matchCA checks c (with intermediates) against a CA peer: exactly one URI SAN matching
// one of its identities, and a chain to its bundle for usage.
func matchCA(p *Peer, chain []*x509.Certificate, usage x509.ExtKeyUsage) error {
	leaf := chain[0]
	san, err := uriSAN(leaf)
	if err != nil {
		return err
	}
	matched := false
	for _, id := range p.Identities {
		if MatchIdentity(id, san) {
			matched = true
			break
		}
	}
	if !matched {
		return fmt.Errorf("URI SAN %q matches no identity of peer %q", san, p.Name)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: p.CA, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("chain to the CA of peer %q: %v", p.Name, err)
	}
	return nil
}

// ErrRefused marks a certificate refused by policy (as opposed to a broken handshake).
var ErrRefused = errors.New("fed: peer refused")

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// Inbound identifies the client certificate chain of an inbound connection (§8.1), with one
// verifier for all peers:
//   - a pin match names the peer; it must accept something (an empty allow is an
//     outbound-only peer), and the certificate must not ALSO pass as a CA peer: one
//     certificate, one identity;
//   - otherwise exactly one CA peer must match (URI SAN + chain for clientAuth).
func (ps *Peers) Inbound(chain []*x509.Certificate) (*Peer, error) {
	if len(chain) == 0 {
		return nil, refused("no client certificate")
	}
	pin := SPKIPin(chain[0])
	pinned := ps.byPin[string(pin)]
	var cas []*Peer
	for _, p := range ps.cas {
		if matchCA(p, chain, x509.ExtKeyUsageClientAuth) == nil {
			cas = append(cas, p)
		}
	}
	switch {
	case pinned != nil && len(cas) > 0:
		return nil, refused("certificate matches pinned peer %q and CA peer %q", pinned.Name, cas[0].Name)
	case pinned != nil:
		// A leaf exists to connect to us (it pulls its mail), whatever it may do besides.
		if len(pinned.Allow) == 0 && !pinned.Leaf {
			return nil, refused("peer %q is outbound-only (empty allow)", pinned.Name)
		}
		return pinned, nil
	case len(cas) > 1:
		return nil, refused("certificate matches %d CA peers (%q, %q)", len(cas), cas[0].Name, cas[1].Name)
	case len(cas) == 0:
		return nil, refused("unknown certificate (pin sha256:%x matches no peer, and no CA peer accepts it)", pin)
	}
	if len(cas[0].Allow) == 0 && !cas[0].Leaf {
		return nil, refused("peer %q is outbound-only (empty allow)", cas[0].Name)
	}
	return cas[0], nil
}

// VerifyServer checks the certificate chain a peer's server presented to us (§8.1).
func (p *Peer) VerifyServer(chain []*x509.Certificate) error {
	if len(chain) == 0 {
		return refused("peer %q presented no certificate", p.Name)
	}
	if p.Pin != nil {
		if got := SPKIPin(chain[0]); !bytes.Equal(got, p.Pin) {
			return refused("peer %q presented pin sha256:%x, want %s", p.Name, got, p.PinString())
		}
		return nil
	}
	if err := matchCA(p, chain, x509.ExtKeyUsageServerAuth); err != nil {
		return refused("%v", err)
	}
	return nil
}
