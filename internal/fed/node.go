// Package fed is xmsg's federation (docs/protocol.md §8, docs/design.md §10): the peers file and
// identity matching, the mTLS listener with its `/fed/v2` routes, the outbound client, the
// rate limits and the credential reloader. It translates, as httpapi does: everything that
// routes or stores is a call into the bus, and the bus reaches other nodes only through the
// bus.Federation interface that Node implements.
//
// Trust: TLS 1.3 only, both sides present certificates, and the whole decision about a
// client certificate is made in VerifyConnection, so a refused peer never reaches HTTP.
// Credentials and the peers file are swapped atomically on reload: each handshake and each
// dial reads the current snapshot once.
package fed

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/creds"
)

// Credential names (LoadCredential=) of the federation inputs.
const (
	CredCert  = "fed-cert"
	CredKey   = "fed-key"
	CredCA    = "fed-ca"
	CredPeers = "peers"
)

// Config of a federating node.
type Config struct {
	Host   string // own host label: the name peers know us by
	Listen string // --fed-listen IP:PORT; "" = client only
	// Fallback paths when $CREDENTIALS_DIRECTORY does not hold the credential.
	CertPath, KeyPath, CAPath, PeersPath string
	ReloadInterval                       time.Duration // 0 = no reload
	PeerRate, PrincipalRate              int           // token buckets, per minute (burst the same)
	MaxBody                              int
	// MaxConns is --fed-max-conns, the listener's connection budget; 0 sizes it from
	// RLIMIT_NOFILE (capacity.go).
	MaxConns int
	// BodyTimeout bounds reading a request body, from the end of its headers (0: 10 s).
	BodyTimeout time.Duration
	Log         *slog.Logger
}

// state is one consistent snapshot of the credentials and the peers file.
type state struct {
	cert   tls.Certificate
	pin    string // "sha256:<hex>" of our own certificate
	peers  *Peers
	hash   [32]byte
	cas    []string // the CA bundles the peers file named, to hash them again on reload
	loaded time.Time
	source creds.Source
}

// Node is a federating node: client always, server when Listen is set.
type Node struct {
	cfg       Config
	st        atomic.Pointer[state]
	transport *http.Transport
	client    *http.Client
	pulls     pullConns // a leaf's pull connection to each hub (pullconn.go)
	limits    *limiter
	rec       *outbox // the outbound half's records (Attach)
	book      book
	dials     atomic.Int64 // outbound TLS handshakes completed: none on the hot path
	// startPorts are the peer ports the sandbox allows (Ports at start), for reload warnings.
	startPorts map[uint16]bool
	cap        capacity                 // the listener's budget (capacity.go)
	lst        atomic.Pointer[listener] // the listener, once serving (doctor)
	builds     atomic.Int64             // snapshots parsed: a reload of unchanged files parses none
	reads      atomic.Int64             // reloads that read the files (the others saw equal stamps)
	reloadMu   sync.Mutex
	stamps     []creds.Stamp // of the inputs last read and found current (under reloadMu)
	stampedAt  time.Time
	stop       chan struct{}
	stopOnce   sync.Once
	wg         sync.WaitGroup
}

// Enabled reports whether cfg asks for federation: a peers file (flag or credential) or a
// listener. The caller reads the credential directory to know.
func Enabled(cfg Config) bool {
	if cfg.Listen != "" || cfg.PeersPath != "" {
		return true
	}
	if d := creds.Dir(); d != "" {
		if _, err := os.Lstat(filepath.Join(d, CredPeers)); err == nil {
			return true
		}
	}
	return false
}

// New loads the credentials and peers and builds the node. It fails with one line naming
// what is wrong (never a secret).
func New(cfg Config) (*Node, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.PeerRate <= 0 {
		cfg.PeerRate = 60
	}
	if cfg.PrincipalRate <= 0 {
		cfg.PrincipalRate = 20
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 65536
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 10 * time.Second
	}
	n := &Node{cfg: cfg, limits: newLimiter(), stop: make(chan struct{}), cap: sizeCapacity(cfg.MaxConns, descriptorLimit())}
	st, err := n.load()
	if err != nil {
		return nil, err
	}
	n.st.Store(st)
	n.startPorts = map[uint16]bool{}
	for _, p := range n.Ports() {
		n.startPorts[p] = true
	}
	n.transport = &http.Transport{
		DialTLSContext:      n.dialTLS,
		MaxIdleConnsPerHost: 8,
		// A peer accepts at most 8 connections from us (§2.6); the eighth is kept for a
		// leaf's pull connection to its hub (pullconn.go).
		MaxConnsPerHost:       7,
		IdleConnTimeout:       50 * time.Second,
		ResponseHeaderTimeout: 0, // bounded by each call's context instead (long-polls)
		DisableCompression:    true,
	}
	n.client = &http.Client{Transport: n.transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	cfg.Log.Info("federation loaded", "pin", st.pin, "peers", len(st.peers.names), "source", string(st.source))
	n.warnCapacity(st)
	return n, nil
}

// warnCapacity says, at start and at each reload, when the peers file names more peers than
// the listener's budget can hold (or the flag asked for more than the descriptor limit).
func (n *Node) warnCapacity(st *state) {
	if n.cfg.Listen == "" {
		return
	}
	for _, w := range n.cap.warnings(st.peers.inbound) {
		n.cfg.Log.Warn("federation capacity: " + w)
	}
}

// Source says where the credentials came from (for doctor).
func (n *Node) Source() creds.Source { return n.st.Load().source }

// Pin is our own certificate's pin, for logs and doctor.
func (n *Node) Pin() string { return n.st.Load().pin }

// Close stops the reloader and closes idle outbound connections.
func (n *Node) Close() {
	n.stopOnce.Do(func() { close(n.stop) })
	n.wg.Wait()
	if n.rec != nil {
		n.rec.bg.Wait()
	}
	n.transport.CloseIdleConnections()
	n.pulls.closeAll()
}

// Known implements bus.Federation.
func (n *Node) Known(peer string) bool {
	_, ok := n.st.Load().peers.Get(peer)
	return ok
}

// Ports returns the TCP ports of the peers we connect to (non-leaf), for the sandbox.
func (n *Node) Ports() []uint16 {
	seen := map[uint16]bool{}
	var out []uint16
	for _, p := range n.st.Load().peers.All() {
		if p.Leaf {
			continue
		}
		if _, port, err := net.SplitHostPort(p.Address); err == nil {
			if v, err := strconv.ParseUint(port, 10, 16); err == nil && !seen[uint16(v)] {
				seen[uint16(v)] = true
				out = append(out, uint16(v))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// CAFiles returns the absolute CA bundle paths the peers file names (outside the
// credentials directory), so the sandbox can keep them readable for reload.
func (n *Node) CAFiles() []string {
	var out []string
	for _, p := range n.st.Load().peers.All() {
		if filepath.IsAbs(p.CAFile) {
			out = append(out, p.CAFile)
		}
	}
	return out
}

// inputs are the raw bytes of one load, read before anything is parsed.
type inputs struct {
	cert, key, peers []byte
	cas              map[string][]byte
	source           creds.Source
}

func (in *inputs) hash() [32]byte {
	h := sha256.New()
	put := func(b []byte) {
		var l [8]byte
		binary.BigEndian.PutUint64(l[:], uint64(len(b)))
		h.Write(l[:])
		h.Write(b)
	}
	put(in.cert)
	put(in.key)
	put(in.peers)
	names := make([]string, 0, len(in.cas))
	for k := range in.cas {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		put([]byte(k))
		put(in.cas[k])
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// readCA reads a CA bundle named by a peer entry: an absolute path, or a credential name
// ("fed-ca" falls back to --fed-ca).
func readCA(cfg Config, name string) ([]byte, error) {
	if filepath.IsAbs(name) {
		return readPlain(name)
	}
	fallback := ""
	if name == CredCA {
		fallback = cfg.CAPath
	}
	raw, _, err := creds.Read(name, fallback)
	if err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, fmt.Errorf("credential %q not found (no $CREDENTIALS_DIRECTORY/%s and no --fed-ca)", name, name)
	}
	return raw, nil
}

// readPlain reads a public file (a CA bundle) without following a symlink, refusing one that
// others may write: whoever can write a CA bundle decides whom we trust.
func readPlain(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %v", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("%s is writable by group or others (mode %04o)", path, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, creds.MaxSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > creds.MaxSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, creds.MaxSize)
	}
	return b, nil
}

// MaxPeersSize is the largest peers file: it grows with the fleet, an entry a leaf (about
// 100 bytes with a short name, 130 with a 20-character one and the pin's "sha256:"), so a
// credential's 1 MiB held only some 10,000 leaves. 16 MiB holds well over 100,000, more
// than the connection budget of any descriptor limit a hub is likely to run with, and
// parsing 100,000 takes about half a second (BenchmarkParsePeersFleet: 52 ms for 10,000),
// once per change (a reload of an unchanged file parses nothing). A file past it is refused
// at start and at reload, the error naming the bound.
const MaxPeersSize = 16 << 20

func readInputs(cfg Config) (*inputs, error) {
	in := &inputs{cas: map[string][]byte{}, source: creds.SourceNone}
	read := func(name, path string, max int) ([]byte, error) {
		raw, src, err := creds.ReadMax(name, path, max)
		if err != nil {
			return nil, err
		}
		if raw != nil {
			in.source = src
		}
		return raw, nil
	}
	var err error
	if in.cert, err = read(CredCert, cfg.CertPath, creds.MaxSize); err != nil {
		return nil, err
	}
	if in.key, err = read(CredKey, cfg.KeyPath, creds.MaxSize); err != nil {
		return nil, err
	}
	if in.peers, err = read(CredPeers, cfg.PeersPath, MaxPeersSize); err != nil {
		return nil, err
	}
	return in, nil
}

// load reads and validates everything; the result is a complete snapshot or an error.
func (n *Node) load() (*state, error) {
	in, err := readInputs(n.cfg)
	if err != nil {
		return nil, fmt.Errorf("fed: %w", err)
	}
	return n.build(in)
}

// stampInputs stamps every input of cur (cert, key, peers file, the CA bundles it names);
// false when one cannot be stamped.
func (n *Node) stampInputs(cur *state) ([]creds.Stamp, bool) {
	var out []creds.Stamp
	add := func(s creds.Stamp, err error) bool {
		out = append(out, s)
		return err == nil
	}
	ok := add(creds.StampOf(CredCert, n.cfg.CertPath)) && add(creds.StampOf(CredKey, n.cfg.KeyPath)) && add(creds.StampOf(CredPeers, n.cfg.PeersPath))
	names := append([]string(nil), cur.cas...)
	sort.Strings(names)
	for _, name := range names {
		switch {
		case filepath.IsAbs(name):
			ok = ok && add(creds.StampPath(name))
		case name == CredCA:
			ok = ok && add(creds.StampOf(name, n.cfg.CAPath))
		default:
			ok = ok && add(creds.StampOf(name, ""))
		}
	}
	return out, ok
}

// sameStamps reports whether stamps equal those of the last read that found the inputs
// current, none of them racy.
func (n *Node) sameStamps(stamps []creds.Stamp) bool {
	if len(stamps) != len(n.stamps) {
		return false
	}
	for i, s := range stamps {
		if s != n.stamps[i] || s.Racy(n.stampedAt) {
			return false
		}
	}
	return true
}

// unchanged reports whether the inputs are byte for byte those of cur, the CA bundles cur
// named included: then a reload has nothing to parse. Any read error says "changed", and
// the full load that follows reports it.
func (n *Node) unchanged(in *inputs, cur *state) bool {
	for _, name := range cur.cas {
		raw, err := readCA(n.cfg, name)
		if err != nil {
			return false
		}
		in.cas[name] = raw
	}
	return in.hash() == cur.hash
}

func (n *Node) build(in *inputs) (*state, error) {
	cfg := n.cfg
	n.builds.Add(1)
	if in.peers == nil {
		return nil, errors.New("fed: federation needs a peers file (--peers-file or the peers credential)")
	}
	if in.cert == nil || in.key == nil {
		return nil, errors.New("fed: federation needs both fed-cert and fed-key (--fed-cert/--fed-key or credentials)")
	}
	cert, pin, err := ParseKeyPair(in.cert, in.key)
	if err != nil {
		return nil, err
	}
	peers, err := ParsePeers(in.peers, func(name string) ([]byte, error) {
		raw, err := readCA(cfg, name)
		if err == nil {
			in.cas[name] = raw
		}
		return raw, err
	})
	if err != nil {
		return nil, err
	}
	cas := make([]string, 0, len(in.cas))
	for name := range in.cas {
		cas = append(cas, name)
	}
	return &state{cert: cert, pin: pin, peers: peers, hash: in.hash(), cas: cas, loaded: time.Now(), source: in.source}, nil
}

// ParseKeyPair parses our certificate (the file may hold a chain; the first is the leaf)
// and its PKCS#8 key, and returns the pair with the leaf's pin. Errors never quote the key.
func ParseKeyPair(certPEM, keyPEM []byte) (tls.Certificate, string, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("fed: fed-cert/fed-key: %v", err)
	}
	if len(pair.Certificate) == 0 {
		return tls.Certificate{}, "", errors.New("fed: fed-cert: no certificate")
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("fed: fed-cert: %v", err)
	}
	pair.Leaf = leaf
	return pair, "sha256:" + hex.EncodeToString(SPKIPin(leaf)), nil
}

// ListenAddr validates --fed-listen: IP:PORT with a specified IP (§2.6).
func ListenAddr(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return ap, fmt.Errorf("fed: --fed-listen %q: want IP:PORT", s)
	}
	if ap.Addr().IsUnspecified() {
		return ap, fmt.Errorf("fed: --fed-listen %q: an unspecified address (0.0.0.0, ::) is refused; name the interface address", s)
	}
	if ap.Port() == 0 {
		return ap, fmt.Errorf("fed: --fed-listen %q: want a port", s)
	}
	return ap, nil
}
