package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/creds"
	"github.com/xmsg/xmsg/internal/doctor"
	"github.com/xmsg/xmsg/internal/fed"
	"github.com/xmsg/xmsg/internal/gate"
	"github.com/xmsg/xmsg/internal/leaf"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/ratelog"
	"github.com/xmsg/xmsg/internal/sandbox"
	"github.com/xmsg/xmsg/internal/servergroup"
)

// leafMode is `xmsg serve --leaf` (docs/protocol.md §7.5): the daemon's startup order
// (docs/design.md §2) with the steps that differ replaced. The only listeners are its
// http.sock and the leaf register socket (self-bound, gated), and the TCP HTTP listener if
// --listen is given; no agent.sock, normal register.sock or federation listener exists, and
// sockets systemd may pass are not taken. A
// leaf is made to run where systemd and Landlock may be missing (a container, gVisor): each
// fallback is said at start and by `xmsg doctor --url`.
type leafMode struct {
	d        *Daemon
	id       leaf.Identity
	hubs     []string
	reg      net.Listener
	regPath  string
	http     net.Listener // the HTTP API on a Unix socket (gated)
	httpPath string
}

// replace returns the daemon's steps with a leaf's: its own credentials, sockets, sandbox and
// servers; no exe or agy helper (a leaf attests no executable). A step it does not name stays
// as it is (the store, sd_notify, silent without NOTIFY_SOCKET).
func (l *leafMode) replace(steps []step) []step {
	own := l.own()
	var out []step
	for _, s := range steps {
		run, ok := own[s.name]
		switch {
		case !ok:
			out = append(out, s)
		case run != nil:
			out = append(out, step{name: s.name, run: run, process: s.process})
		}
	}
	return out
}

// own is the leaf's version of each step that differs, by name; nil leaves the step out.
func (l *leafMode) own() map[string]func() error {
	return map[string]func() error{
		"credentials":  l.loadCredentials, // the principal, the federation node (the hubs)
		"sockets":      l.bindSockets,     // TCP and the leaf register socket only
		"exe helper":   nil,
		"agy helper":   nil,
		"session dirs": nil,            // a leaf serves no session directory
		"custody":      nil,            // a leaf holds no secrets (config refuses --custody with --leaf)
		"sandbox":      l.applySandbox, // best effort
		"servers":      l.buildServers,
	}
}

// loadCredentials is step 1 of a leaf: its principal, and the federation node, which a leaf
// cannot do without (the peers file names its hubs).
func (l *leafMode) loadCredentials() error {
	d := l.d
	id, err := leaf.ParsePrincipal(d.cfg.LeafPrincipal)
	if err != nil {
		return ConfigError{err}
	}
	l.id = id
	d.facts = doctor.Facts{Daemon: true, PeerGate: true, Systemd: os.Getenv("INVOCATION_ID") != "", Leaf: id.Principal}
	fc := fedConfig(d.cfg, d.log)
	fc.Listen = "" // config refused --fed-listen already; a leaf accepts no federation connection
	if !fed.Enabled(fc) {
		return errors.New("leaf: --leaf needs a peers file naming its hub (--peers-file or the peers credential) and fed-cert/fed-key")
	}
	node, err := fed.New(fc)
	if err != nil {
		return err
	}
	d.onClose(func() error { node.Close(); return nil })
	d.fed = &federation{cfg: d.cfg, log: d.log, node: node}
	if l.hubs = node.Hubs(); len(l.hubs) == 0 {
		return errors.New("leaf: the peers file names no hub (every peer is a leaf)")
	}
	d.facts.Credentials = string(creds.SourcePath)
	if creds.Dir() != "" {
		d.facts.Credentials = string(creds.SourceCredentialsDirectory)
	}
	return nil
}

// bindSockets is step 3 of a leaf: the leaf register socket (self-bound, verified like every
// self-bound socket) and the TCP listener, both before the sandbox.
func (l *leafMode) bindSockets() error {
	d := l.d
	if os.Getenv("LISTEN_FDS") != "" {
		d.log.Warn("leaf mode ignores sockets passed by systemd (LISTEN_FDS): a leaf serves none of http, agent or register.sock")
	}
	l.regPath = d.cfg.LeafRegisterSock
	if l.regPath == "" {
		def, err := activation.DefaultPaths()
		if err != nil {
			return fmt.Errorf("leaf: no --leaf-register-sock and %w", err)
		}
		l.regPath = def.Register
	}
	reg, err := activation.Bind(l.regPath)
	if err != nil {
		return err
	}
	l.reg = reg
	d.onClose(ignoreClosed(reg.Close))
	d.facts.SocketDir = filepath.Dir(l.regPath)
	// The HTTP API on a Unix socket beside it, behind the peer gate like every daemon's: in a
	// pod, the shared volume's socket is the bot's way in; TCP (--listen) has no gate and is
	// only for a bot that cannot use a socket.
	l.httpPath = d.cfg.HTTPSock
	if l.httpPath == "" {
		l.httpPath = filepath.Join(filepath.Dir(l.regPath), activation.NameHTTP+".sock")
	}
	if l.http, err = activation.Bind(l.httpPath); err != nil {
		return err
	}
	d.onClose(ignoreClosed(l.http.Close))
	if d.cfg.Listen != "" {
		if err := d.listenTCP(); err != nil {
			return err
		}
	}
	d.log.Info("leaf sockets", "register", l.regPath, "http", l.httpPath)
	return nil
}

// applySandbox is step 5 of a leaf: the state directory read-write, /proc read-only (the
// register socket's start-time checks), the credentials read-only, the register socket's
// file removable at stop, TCP connects to the hubs' ports only. No Unix socket is connected
// to and no TCP port is bound after this.
func (l *leafMode) applySandbox() error {
	d := l.d
	policy := sandbox.Policy{
		ReadWrite:   []string{filepath.Dir(d.cfg.DBPath)},
		ReadOnly:    []string{"/proc"},
		RemoveFiles: removable(l.regPath, l.httpPath),
		Require:     d.cfg.RequireLandlock,
	}
	if dir := creds.Dir(); dir != "" {
		policy.ReadOnly = append(policy.ReadOnly, dir)
	}
	d.fed.restrict(&policy)
	report, err := d.sandbox(policy)
	if err != nil {
		return err
	}
	if named := d.fed.node.NamedHubs(); len(named) > 0 && report.Net != sandbox.Unavailable {
		// Landlock's network rules leave no way to a DNS server: name the hub by IP.
		d.log.Warn("hub address is a host name, which cannot be resolved under Landlock; give an IP in the peers file", "peers", named)
	}
	return nil
}

// buildServers is step 6 of a leaf up to serving: the HTTP API on TCP, the service's register
// socket, and one pull loop per hub, as one server group.
func (l *leafMode) buildServers() error {
	oneProc()
	d := l.d
	cfg := d.cfg
	proc := peercred.Proc{}
	uid := uint32(os.Geteuid())
	b := bus.New(bus.Config{
		Host: cfg.HostLabel, MaxBody: cfg.MaxBody, ReplyTTL: cfg.ReplyTTL, IdemTTL: cfg.IdempotencyTTL,
		Store: d.store, Proc: proc, Log: d.log, Fed: d.fed.bus(d.store, nil), Leaf: l.id.Bus(), MaxWaiters: cfg.Limits.HTTPMaxWaiters,
		// A leaf has no Claude sessions: nothing is scanned.
		Claude: &claude.Scanner{Proc: proc, UID: int(uid), Log: d.log},
		Bounds: busBounds(cfg),
		Events: d.buildEvents().stream,
		// The service's acks ride the commit of the next batch pulled instead of one of their
		// own 5 ms later: a leaf that gets a message now and then paid two commits for each.
		AckRide: leaf.AckRide,
		// The pulled rows' records ride a commit made anyway (the hub holds each row until
		// the puller acks it, which it does once they are stored).
		RecordRide: limits.Or(d.c.RecordRide, leaf.RecordRide),
	})
	d.bus = b
	d.events.setHarnesses(b.Harnesses())
	d.onClose(func() error { b.Close(); return nil })
	// A hub that refuses or is away is retried every 5 s for as long as it lasts: its
	// warnings pass once per 30 s per hub, code and delay (so the backoff's climb shows
	// once, the steady retries every 30 s), with the count of the others.
	pullLog := slog.New(ratelog.Handler(d.log.Handler(), &ratelog.Limiter{Every: 30 * time.Second}, "peer", "code", "retry_in"))
	var pullers []*leaf.Puller
	for _, h := range l.hubs {
		pullers = append(pullers, &leaf.Puller{Bus: b, Hub: d.fed.node, Peer: h, Service: l.id.Service, Events: b.Events(), MaxBody: cfg.MaxBody, Log: pullLog})
	}
	doctorLines := func() []string {
		lines := append(d.facts.Lines(), storeLine(d.store.Info()))
		for _, p := range pullers {
			lines = append(lines, p.Status())
		}
		return append(lines, d.fed.doctor()...)
	}
	// The same bounds as every daemon's sockets (limits.go). The pull loops end with the HTTP
	// long-polls when the stop begins (a row delivered but not yet acked to the hub stays
	// there and is handed out again).
	d.addHTTP("http", httpListener(gate.Listener(l.http, uid, "http", d.log), cfg, d.log), doctorLines)
	if d.tcp != nil {
		d.addHTTP("tcp", tcpListener(d.tcp, cfg, d.log), doctorLines)
	}
	d.addRegister(gate.Listener(l.reg, uid, "register", d.log))
	for _, p := range pullers {
		done := make(chan struct{})
		d.group.Add(servergroup.Server{Name: "pull " + p.Peer,
			Serve: func() error { defer close(done); p.Run(d.runCtx); return nil },
			Shutdown: func(c context.Context) error {
				d.stopRun()
				select {
				case <-done:
					return nil
				case <-c.Done():
					return c.Err()
				}
			}})
	}
	d.fed.node.StartReload()
	register := d.register
	d.status = func() string {
		c, _ := b.Counts()
		return fmt.Sprintf("leaf serving: %d registrations, %d connections, %d messages, %d queued", c.Registrations, register.Conns(), c.Messages, c.Queued)
	}
	d.serving = []any{"mode", "leaf", "principal", l.id.Principal, "service", "svc:" + l.id.Service,
		"hubs", l.hubs, "db", cfg.DBPath, "host_label", cfg.HostLabel}
	return nil
}

// removable is the directories of paths, each once: the sandbox lets the daemon remove its
// self-bound socket files there at stop.
func removable(paths ...string) []string {
	var dirs []string
	for _, p := range paths {
		if d := filepath.Dir(p); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}
