package fed

import (
	"bytes"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/xmsg/xmsg/internal/envelope"
)

// Peer is one entry of the peers file (docs/protocol.md §8.2), validated.
type Peer struct {
	Name    string
	Address string // host:port, where we connect

	// Exactly one trust kind: Pin (32 bytes, SHA-256 of the SPKI) or CA (with Identities).
	Pin        []byte
	CA         *x509.CertPool
	CAFile     string // as written in the peers file
	Identities []string

	Allow map[string]bool // operations this peer may perform on us; empty = outbound only
	// From: source addresses the peer may connect from; nil = any.
	From []netip.Prefix
	Leaf bool
	// Principals: allowed sender principals (kind-qualified); nil = any.
	Principals []string
	// Targets: local targets the peer may reach or list; TargetsSet false = no restriction,
	// true (even with none listed) = only those.
	Targets    []string
	TargetsSet bool
}

// Trust names the peer's trust kind for logs and doctor.
func (p *Peer) Trust() string {
	if p.Pin != nil {
		return "pin"
	}
	return "ca"
}

// PinString is the pin as configured, normalized: "sha256:<lowercase hex>".
func (p *Peer) PinString() string { return "sha256:" + hex.EncodeToString(p.Pin) }

// AllowList is Allow sorted, for display.
func (p *Peer) AllowList() []string {
	var out []string
	for k := range p.Allow {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Peers is a parsed peers file.
type Peers struct {
	byName map[string]*Peer
	names  []string // sorted
	// inbound counts the peers that may connect to us (a leaf, or a non-empty allow); each
	// keeps room for a connection of its own (capacity.go). fromless says one of them has
	// no `from` list, so no source address can be refused before TLS.
	inbound  int
	fromless bool
	froms    []netip.Prefix // every `from` entry of those peers
	// byPin and cas are what an inbound certificate is judged against (identity.go): a hub
	// of thousands of pinned leaves finds the pin with one lookup, not a pass over them all.
	byPin map[string]*Peer
	cas   []*Peer // peers judged by a CA, sorted by name
}

// Inbound reports whether p may connect to us at all: an outbound-only peer is refused in
// the handshake.
func (p *Peer) Inbound() bool { return p.Leaf || len(p.Allow) > 0 }

// SourceKnown reports whether a connection from addr could belong to any peer: false when
// every peer that may connect has a `from` list and none contains addr, so the listener
// closes it before spending a TLS handshake on it.
func (ps *Peers) SourceKnown(addr netip.Addr) bool {
	if ps.fromless {
		return true
	}
	addr = addr.Unmap().WithZone("")
	for _, pfx := range ps.froms {
		if pfx.Contains(addr) {
			return true
		}
	}
	return false
}

// Get returns the peer called name.
func (ps *Peers) Get(name string) (*Peer, bool) {
	if ps == nil {
		return nil, false
	}
	p, ok := ps.byName[name]
	return p, ok
}

// All returns every peer, sorted by name.
func (ps *Peers) All() []*Peer {
	out := make([]*Peer, 0, len(ps.names))
	for _, n := range ps.names {
		out = append(out, ps.byName[n])
	}
	return out
}

// ReadCA reads the PEM bundle a peer's `ca` field names.
type ReadCA func(name string) ([]byte, error)

// peerFields are the fields an entry may have; anything else is a load error naming it.
var peerFields = map[string]bool{"name": true, "address": true, "pin": true, "ca": true, "identities": true,
	"allow": true, "from": true, "leaf": true, "principals": true, "targets": true}

var allowOps = map[string]bool{"send": true, "reply": true, "list": true}

var principalKinds = []string{"claude:", "agy:", "pi:", "svc:", "anon:", "session:"}
var targetKinds = []string{"claude:", "agy:", "pi:", "svc:", "session:"}

// ParsePeers parses and validates a peers file. Every accepted shape of §8.2 is read:
// {"<name>": {...}}, {"peers": {"<name>": {...}}} and [{"name": ..., ...}]. Errors name the
// peer and the field, never a secret (the file holds none; pins are public).
func ParsePeers(raw []byte, readCA ReadCA) (*Peers, error) {
	type entry struct {
		key string
		raw json.RawMessage
	}
	var entries []entry
	trimmed := bytes.TrimSpace(raw)
	switch {
	case len(trimmed) > 0 && trimmed[0] == '[':
		var list []json.RawMessage
		if err := strictUnmarshal(trimmed, &list); err != nil {
			return nil, fmt.Errorf("fed: peers: %v", err)
		}
		for i, e := range list {
			entries = append(entries, entry{key: "#" + strconv.Itoa(i), raw: e})
		}
	case len(trimmed) > 0 && trimmed[0] == '{':
		keys, m, err := objectInOrder(trimmed)
		if err != nil {
			return nil, fmt.Errorf("fed: peers: %v", err)
		}
		if len(keys) == 1 && keys[0] == "peers" && isWrapper(m["peers"]) {
			if keys, m, err = objectInOrder(m["peers"]); err != nil {
				return nil, fmt.Errorf("fed: peers: \"peers\": %v", err)
			}
		}
		for _, k := range keys {
			entries = append(entries, entry{key: k, raw: m[k]})
		}
	default:
		return nil, errors.New("fed: peers: want a JSON object or array")
	}
	ps := &Peers{byName: map[string]*Peer{}, byPin: map[string]*Peer{}}
	for _, e := range entries {
		p, err := parsePeer(e.key, e.raw, readCA)
		if err != nil {
			return nil, err
		}
		if _, dup := ps.byName[p.Name]; dup {
			return nil, fmt.Errorf("fed: peers: peer %q: duplicate peer name", p.Name)
		}
		if p.Pin != nil {
			// One pin, one peer: an inbound certificate must name exactly one.
			if other, dup := ps.byPin[string(p.Pin)]; dup {
				return nil, fmt.Errorf("fed: peers: peer %q: field \"pin\": same pin as peer %q", p.Name, other.Name)
			}
			ps.byPin[string(p.Pin)] = p
		}
		ps.byName[p.Name] = p
		ps.names = append(ps.names, p.Name)
		if p.Inbound() {
			ps.inbound++
			ps.fromless = ps.fromless || p.From == nil
			ps.froms = append(ps.froms, p.From...)
		}
	}
	sort.Strings(ps.names)
	for _, n := range ps.names {
		if p := ps.byName[n]; p.Pin == nil {
			ps.cas = append(ps.cas, p)
		}
	}
	return ps, nil
}

// isWrapper tells the {"peers": {...}} shape from a single peer that happens to be called
// "peers": a peer entry has an address.
func isWrapper(v json.RawMessage) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(v, &m) != nil {
		return false
	}
	_, hasAddress := m["address"]
	return !hasAddress
}

// strictUnmarshal decodes exactly one JSON value.
func strictUnmarshal(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// objectInOrder decodes an object keeping its key order (for error messages that name the
// first bad peer) and refusing duplicate keys, which json.Unmarshal would silently merge.
func objectInOrder(raw []byte) ([]string, map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, errors.New("want a JSON object")
	}
	var keys []string
	m := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, fmt.Errorf("%q: %v", k, err)
		}
		if _, dup := m[k]; dup {
			return nil, nil, fmt.Errorf("peer %q: duplicate peer name", k)
		}
		keys = append(keys, k)
		m[k] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, err
	}
	if dec.More() {
		return nil, nil, errors.New("trailing data")
	}
	if _, err := dec.Token(); err == nil {
		return nil, nil, errors.New("trailing data")
	}
	return keys, m, nil
}

// ValidPeerName: names appear in refs (x@name), badges and the TLS server name; the rule is
// envelope's, the one services' names follow too.
func ValidPeerName(n string) bool { return envelope.ValidPeerName(n) }

func parsePeer(key string, raw json.RawMessage, readCA ReadCA) (*Peer, error) {
	fields := map[string]json.RawMessage{}
	if err := strictUnmarshal(raw, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("fed: peers: peer %q: want an object", key)
	}
	name := key
	if v, ok := fields["name"]; ok {
		if err := json.Unmarshal(v, &name); err != nil {
			return nil, fmt.Errorf("fed: peers: peer %q: field \"name\": want a string", key)
		}
	}
	fail := func(field, format string, args ...any) error {
		return fmt.Errorf("fed: peers: peer %q: field %q: %s", name, field, fmt.Sprintf(format, args...))
	}
	if strings.HasPrefix(name, "#") {
		return nil, fmt.Errorf("fed: peers: entry %s: field \"name\": missing", key[1:])
	}
	if !ValidPeerName(name) {
		return nil, fail("name", "must match [A-Za-z0-9._-]{1,63}")
	}
	var unknown []string
	for f := range fields {
		if !peerFields[f] {
			unknown = append(unknown, f)
		}
	}
	sort.Strings(unknown)
	for _, f := range unknown {
		if f == "no_whois" {
			return nil, fail(f, "is obsolete; restrict source addresses with \"from\"")
		}
		return nil, fail(f, "unknown field")
	}
	p := &Peer{Name: name}
	str := func(field string) (string, bool, error) {
		v, ok := fields[field]
		if !ok {
			return "", false, nil
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", true, fail(field, "want a string")
		}
		return s, true, nil
	}
	list := func(field string) ([]string, bool, error) {
		v, ok := fields[field]
		if !ok {
			return nil, false, nil
		}
		var elems []json.RawMessage
		if err := json.Unmarshal(v, &elems); err != nil || elems == nil {
			return nil, true, fail(field, "want an array of strings")
		}
		out := []string{}
		for i, e := range elems {
			var s string
			if err := json.Unmarshal(e, &s); err != nil {
				return nil, true, fail(field, "element %d is not a string", i)
			}
			out = append(out, s)
		}
		return out, true, nil
	}
	if v, ok := fields["leaf"]; ok {
		if err := json.Unmarshal(v, &p.Leaf); err != nil {
			return nil, fail("leaf", "want true or false")
		}
	}
	var err error
	var ok bool
	if p.Address, ok, err = str("address"); err != nil {
		return nil, err
	}
	switch {
	case (!ok || p.Address == "") && !p.Leaf: // a leaf is never dialled: it may have none
		return nil, fail("address", "missing (want host:port)")
	case ok:
		host, port, err := net.SplitHostPort(p.Address)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			return nil, fail("address", "%q is not host:port", p.Address)
		}
	}
	pin, hasPin, err := str("pin")
	if err != nil {
		return nil, err
	}
	ca, hasCA, err := str("ca")
	if err != nil {
		return nil, err
	}
	ids, hasIDs, err := list("identities")
	if err != nil {
		return nil, err
	}
	switch {
	case hasPin && hasCA:
		return nil, fail("pin", "both \"pin\" and \"ca\" given; want exactly one")
	case !hasPin && !hasCA:
		return nil, fail("pin", "neither \"pin\" nor \"ca\" given; want exactly one")
	case hasPin && hasIDs:
		return nil, fail("identities", "only with \"ca\" (a pinned peer has no identities)")
	case hasPin:
		if p.Pin, err = ParsePin(pin); err != nil {
			return nil, fail("pin", "%v", err)
		}
	default:
		if !hasIDs || len(ids) == 0 {
			return nil, fail("identities", "\"ca\" needs a non-empty \"identities\" list")
		}
		for _, id := range ids {
			if err := ValidPattern(id); err != nil {
				return nil, fail("identities", "%q: %v", id, err)
			}
		}
		p.Identities = ids
		p.CAFile = ca
		if ca == "" {
			return nil, fail("ca", "empty")
		}
		if readCA == nil {
			return nil, fail("ca", "no way to read CA files")
		}
		pemData, err := readCA(ca)
		if err != nil {
			return nil, fail("ca", "%v", err)
		}
		if p.CA, err = ParseCABundle(pemData); err != nil {
			return nil, fail("ca", "%v", err)
		}
	}
	allow, _, err := list("allow")
	if err != nil {
		return nil, err
	}
	p.Allow = map[string]bool{}
	for _, op := range allow {
		if !allowOps[op] {
			return nil, fail("allow", "unknown operation %q (want send, reply, list)", op)
		}
		p.Allow[op] = true
	}
	if from, hasFrom, err := list("from"); err != nil {
		return nil, err
	} else if hasFrom {
		if len(from) == 0 {
			return nil, fail("from", "empty list would refuse every address; omit it to allow any")
		}
		for _, f := range from {
			pfx, err := parseSource(f)
			if err != nil {
				return nil, fail("from", "%q is not an IP address or CIDR", f)
			}
			p.From = append(p.From, pfx)
		}
	}
	if pr, hasPr, err := list("principals"); err != nil {
		return nil, err
	} else if hasPr {
		for _, s := range pr {
			if !kindQualified(s, principalKinds) {
				return nil, fail("principals", "%q must be kind-qualified (claude:, agy:, pi:, svc:, anon:, session:)", s)
			}
		}
		p.Principals = pr
	}
	if tg, hasTg, err := list("targets"); err != nil {
		return nil, err
	} else if hasTg {
		for _, s := range tg {
			if !kindQualified(s, targetKinds) {
				return nil, fail("targets", "%q must be kind-qualified (claude:, agy:, pi:, svc:, session:)", s)
			}
		}
		p.Targets, p.TargetsSet = tg, true
	}
	return p, nil
}

func kindQualified(s string, kinds []string) bool {
	for _, k := range kinds {
		if rest, ok := strings.CutPrefix(s, k); ok {
			return rest != "" && strings.TrimSpace(rest) == rest
		}
	}
	return false
}

// parseSource parses a `from` entry: a CIDR or a single IP. IPv4-mapped IPv6 is unmapped, so
// "::ffff:192.0.2.1" and "192.0.2.1" are the same source.
func parseSource(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, err
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			return netip.PrefixFrom(a.Unmap(), p.Bits()-96).Masked(), nil
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// SourceAllowed reports whether addr may be a connection source for p.
func (p *Peer) SourceAllowed(addr netip.Addr) bool {
	if p.From == nil {
		return true
	}
	addr = addr.Unmap().WithZone("")
	for _, pfx := range p.From {
		if pfx.Contains(addr) {
			return true
		}
	}
	return false
}

// ParsePin parses "sha256:<hex>" (prefix optional, any case) into 32 bytes.
func ParsePin(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if len(s) >= 7 && strings.EqualFold(s[:7], "sha256:") {
		s = s[7:]
	}
	if len(s) != 64 {
		return nil, errors.New("want sha256:<64 hex digits>")
	}
	b, err := hex.DecodeString(strings.ToLower(s))
	if err != nil {
		return nil, errors.New("want sha256:<64 hex digits>")
	}
	return b, nil
}

// ParseCABundle parses a PEM bundle in which every certificate is a CA (CA:TRUE).
func ParseCABundle(data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %v", n+1, err)
		}
		if !c.BasicConstraintsValid || !c.IsCA {
			return nil, fmt.Errorf("certificate %d (%s) is not a CA (CA:TRUE)", n+1, c.Subject)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, errors.New("no certificate in the bundle")
	}
	return pool, nil
}
