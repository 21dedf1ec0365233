package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/creds"
	"github.com/xmsg/xmsg/internal/fed"
	"github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/sandbox"
	"github.com/xmsg/xmsg/internal/servergroup"
	"github.com/xmsg/xmsg/internal/store"
)

// federation is the daemon's wiring of internal/fed: loaded with the credentials (step 1),
// its listener bound with the other sockets (step 3), its ports given to the sandbox
// (step 5), served with the other servers (step 6). Every method is a no-op without
// federation, so serve calls them unconditionally.
type federation struct {
	cfg  *config.Config
	log  *slog.Logger
	node *fed.Node
	ln   net.Listener
	srv  *fed.Server
}

func fedConfig(cfg *config.Config, log *slog.Logger) fed.Config {
	return fed.Config{Host: cfg.HostLabel, Listen: cfg.FedListen, CertPath: cfg.FedCert, KeyPath: cfg.FedKey, CAPath: cfg.FedCA,
		PeersPath: cfg.PeersFile, ReloadInterval: cfg.FedReloadInterval, PeerRate: cfg.FedRatePeer, PrincipalRate: cfg.FedRatePrincipal,
		MaxBody: cfg.MaxBody, MaxConns: cfg.FedMaxConns, BodyTimeout: cfg.FedBodyTimeout, Log: log}
}

// loadCredentials reads and validates the federation credentials, from
// $CREDENTIALS_DIRECTORY (LoadCredential=) or the plain-path flags, and builds the federation
// node when a peers file or --fed-listen asks for one. Without federation, credentials that
// are present are still checked, so a bad deployment shows at start. Only fingerprints are
// logged, never content.
func loadCredentials(cfg *config.Config, log *slog.Logger) (creds.Source, *federation, error) {
	f := &federation{cfg: cfg, log: log}
	fc := fedConfig(cfg, log)
	if fed.Enabled(fc) {
		if cfg.FedListen != "" {
			if _, err := fed.ListenAddr(cfg.FedListen); err != nil {
				return creds.SourceNone, nil, err
			}
		}
		n, err := fed.New(fc)
		if err != nil {
			return creds.SourceNone, nil, err
		}
		f.node = n
		return n.Source(), f, nil
	}
	source := creds.SourceNone
	read := func(name, path string) ([]byte, error) {
		raw, src, err := creds.Read(name, path)
		if raw != nil {
			source = src
		}
		return raw, err
	}
	cert, err := read(fed.CredCert, cfg.FedCert)
	if err != nil {
		return source, nil, err
	}
	key, err := read(fed.CredKey, cfg.FedKey)
	if err != nil {
		return source, nil, err
	}
	ca, err := read(fed.CredCA, cfg.FedCA)
	if err != nil {
		return source, nil, err
	}
	if (cert == nil) != (key == nil) {
		return source, nil, errors.New("credentials: fed-cert and fed-key must be given together")
	}
	if cert != nil {
		_, pin, err := fed.ParseKeyPair(cert, key)
		if err != nil {
			return source, nil, err
		}
		log.Info("credential loaded", "name", fed.CredCert, "source", string(source), "pin", pin)
	}
	if ca != nil {
		if _, err := fed.ParseCABundle(ca); err != nil {
			return source, nil, fmt.Errorf("credentials: fed-ca: %v", err)
		}
		log.Info("credential loaded", "name", fed.CredCA, "source", string(source))
	}
	return source, f, nil
}

// listen binds --fed-listen, before the sandbox (which allows binding only that port anyway).
func (f *federation) listen(onClose func(func() error)) error {
	if f.node == nil || f.cfg.FedListen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", f.cfg.FedListen)
	if err != nil {
		return fmt.Errorf("fed: listen %s: %w", f.cfg.FedListen, err)
	}
	f.ln = ln
	onClose(ignoreClosed(ln.Close))
	f.log.Info("federation listener", "addr", ln.Addr().String(), "pin", f.node.Pin())
	return nil
}

// restrict adds federation's needs to the sandbox: bind only the listener's port, connect
// only to the peers' ports (Landlock matches ports, not addresses), and keep CA bundles named
// by absolute path readable for reload.
func (f *federation) restrict(p *sandbox.Policy) {
	if f.node == nil {
		return
	}
	if f.ln != nil {
		p.BindTCP = append(p.BindTCP, uint16(f.ln.Addr().(*net.TCPAddr).Port))
	}
	p.ConnectTCP = append(p.ConnectTCP, f.node.Ports()...)
	// Plain-path credentials and CA bundles are re-read on reload. Their directories, not the
	// files, are allowed: a Landlock rule holds an inode, and a rotation that renames a new
	// file into place would otherwise be unreadable.
	for _, path := range append([]string{f.cfg.FedCert, f.cfg.FedKey, f.cfg.FedCA, f.cfg.PeersFile}, f.node.CAFiles()...) {
		if path == "" {
			continue
		}
		if abs, err := filepath.Abs(path); err == nil { // Landlock rules need absolute paths
			p.ReadOnly = append(p.ReadOnly, filepath.Dir(abs))
		}
	}
}

// bus returns the bus's view of federation (a nil interface without it), its sends recorded
// in st and its leaves' mail kept in mail (nil: a leaf, which keeps none).
func (f *federation) bus(st *store.Store, mail *hub.Mailboxes) bus.Federation {
	if f.node == nil {
		return nil
	}
	f.node.Attach(st, mail, nil)
	return f.node
}

// serve starts the reloader and adds the listener's server to the daemon's group; the
// node is closed when the group stops it (or, without a listener, when the daemon closes).
func (f *federation) serve(b *bus.Bus, ctx context.Context, add func(servergroup.Server), onClose func(func() error)) {
	if f.node == nil {
		return
	}
	f.node.StartReload()
	if f.ln == nil {
		onClose(func() error { f.node.Close(); return nil })
		return
	}
	f.srv = f.node.NewServer(f.ln, b)
	f.srv.BaseContext(ctx)
	add(servergroup.Server{Name: "fed", Serve: f.srv.Serve, Shutdown: func(ctx context.Context) error {
		err := f.srv.Shutdown(ctx)
		f.node.Close()
		return err
	}})
}

// doctor lines of the running federation.
func (f *federation) doctor() []string {
	if f.node == nil {
		return []string{"federation: off (no peers file)"}
	}
	return f.node.DoctorLines()
}

// mailboxes are the hub's leaf mailboxes (nil without federation or without a leaf).
func (f *federation) mailboxes() *hub.Mailboxes {
	if f == nil || f.node == nil {
		return nil
	}
	return f.node.Mailboxes()
}

// handshakes are the federation's handshake counts and each peer's state (nil without).
func (f *federation) handshakes() (map[fed.HandshakeKey]uint64, map[fed.HandshakeKey]bool) {
	if f == nil || f.node == nil {
		return nil, nil
	}
	return f.node.Handshakes()
}

// listenerCounts are the federation listener's refusals for capacity and evictions (ok
// false without a listener).
func (f *federation) listenerCounts() (refused, evicted uint64, ok bool) {
	if f == nil || f.node == nil {
		return 0, 0, false
	}
	return f.node.ListenerCounts()
}

// leafPeers are the configured leaf peers' names.
func (f *federation) leafPeers() []string {
	if f == nil || f.node == nil {
		return nil
	}
	return f.node.LeafPeers()
}
