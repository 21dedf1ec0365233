package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/creds"
	"github.com/xmsg/xmsg/internal/doctor"
	"github.com/xmsg/xmsg/internal/fed"
	"github.com/xmsg/xmsg/internal/gate"
	"github.com/xmsg/xmsg/internal/httpapi"
	"github.com/xmsg/xmsg/internal/leaf"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/ratelog"
	"github.com/xmsg/xmsg/internal/registersock"
	"github.com/xmsg/xmsg/internal/sandbox"
	"github.com/xmsg/xmsg/internal/servergroup"
)

// leafInstance is `xmsg serve --leaf` (docs/protocol.md §7.5): the daemon's startup order
// (docs/design.md §2) with the steps that differ replaced. The only listeners are the TCP HTTP
// listener (--listen) and the leaf register socket; no http.sock, agent.sock, normal
// register.sock or federation listener exists, and sockets systemd may pass are not taken. A
// leaf is made to run where systemd and Landlock may be missing (a container, gVisor): each
// fallback is said at start and by `xmsg doctor --url`.
type leafInstance struct {
	*instance
	id      bus.LeafIdentity
	hubs    []string
	reg     net.Listener
	regPath string
}

// serveLeaf runs leaf mode; serve calls it once the flags say --leaf.
func serveLeaf(ctx context.Context, cfg *config.Config) error {
	d := &leafInstance{instance: &instance{cfg: cfg, log: newLogger(cfg.LogLevel, os.Stderr)}}
	defer d.close()
	started, err := d.start(ctx, []step{
		{"credentials", d.loadCredentials}, // 1. the principal, the federation node (the hubs)
		{"store", d.openStore},             // 2.
		{"sockets", d.bindSockets},         // 3. TCP and the leaf register socket only
		{"notify", d.openNotify},           // 4. silent without NOTIFY_SOCKET
		{"sandbox", d.applySandbox},        // 5. best effort (no exe helper: nothing to attest)
	})
	if !started {
		return err
	}
	return d.serve(ctx) // 6. and 7.
}

// loadCredentials is step 1 of a leaf: its principal, and the federation node, which a leaf
// cannot do without (the peers file names its hubs).
func (d *leafInstance) loadCredentials() error {
	id, err := leaf.ParsePrincipal(d.cfg.LeafPrincipal)
	if err != nil {
		return usageError{err.Error()}
	}
	d.id = id
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
	if d.hubs = node.Hubs(); len(d.hubs) == 0 {
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
func (d *leafInstance) bindSockets() error {
	if os.Getenv("LISTEN_FDS") != "" {
		d.log.Warn("leaf mode ignores sockets passed by systemd (LISTEN_FDS): a leaf serves none of http, agent or register.sock")
	}
	d.regPath = d.cfg.LeafRegisterSock
	if d.regPath == "" {
		def, err := activation.DefaultPaths()
		if err != nil {
			return fmt.Errorf("leaf: no --leaf-register-sock and %w", err)
		}
		d.regPath = def.Register
	}
	reg, err := activation.Bind(d.regPath)
	if err != nil {
		return err
	}
	d.reg = reg
	d.onClose(ignoreClosed(reg.Close))
	d.facts.SocketDir = filepath.Dir(d.regPath)
	tcp, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", d.cfg.Listen, err)
	}
	d.tcp = tcp
	d.onClose(ignoreClosed(tcp.Close))
	d.facts.TCPListen = tcp.Addr().String()
	d.log.Warn("tcp listener without peer check", "addr", tcp.Addr().String())
	d.log.Info("leaf register socket", "path", d.regPath)
	return nil
}

// applySandbox is step 5 of a leaf: the state directory read-write, /proc read-only (the
// register socket's start-time checks), the credentials read-only, the register socket's
// file removable at stop, TCP connects to the hubs' ports only. No Unix socket is connected
// to and no TCP port is bound after this.
func (d *leafInstance) applySandbox() error {
	policy := sandbox.Policy{
		ReadWrite:   []string{filepath.Dir(d.cfg.DBPath)},
		ReadOnly:    []string{"/proc"},
		RemoveFiles: []string{filepath.Dir(d.regPath)},
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

// serve is steps 6 and 7 of a leaf: the HTTP API on TCP, the service's register socket, and
// one pull loop per hub, as one server group.
func (d *leafInstance) serve(ctx context.Context) error {
	cfg := d.cfg
	proc := peercred.Proc{}
	uid := uint32(os.Geteuid())
	b := bus.New(bus.Config{
		Host: cfg.HostLabel, MaxBody: cfg.MaxBody, ReplyTTL: cfg.ReplyTTL, IdemTTL: cfg.IdempotencyTTL,
		Store: d.store, Proc: proc, Log: d.log, Fed: d.fed.bus(), Leaf: &d.id, MaxWaiters: cfg.Limits.HTTPMaxWaiters,
		// A leaf has no Claude sessions: nothing is scanned.
		Claude: &claude.Scanner{Proc: proc, UID: int(uid), Log: d.log},
	})
	defer b.Close()
	var pullers []*leaf.Puller
	// A hub that refuses or is away is retried every 5 s for as long as it lasts: its
	// warnings pass once per 30 s per hub, code and delay (so the backoff's climb shows
	// once, the steady retries every 30 s), with the count of the others.
	pullLog := slog.New(ratelog.Handler(d.log.Handler(), &ratelog.Limiter{Every: 30 * time.Second}, "peer", "code", "retry_in"))
	for _, h := range d.hubs {
		pullers = append(pullers, &leaf.Puller{Bus: b, Hub: d.fed.node, Peer: h, MaxBody: cfg.MaxBody, Log: pullLog})
	}
	doctorLines := func() []string {
		lines := d.facts.Lines()
		for _, p := range pullers {
			lines = append(lines, p.Status())
		}
		return append(lines, d.fed.doctor()...)
	}
	// Cancelled when the stop begins: HTTP long-polls answer and the pull loops end (a row
	// delivered but not yet acked to the hub stays there and is handed out again).
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()

	group := servergroup.Group{Drain: drainTimeout}
	// The same bounds as every daemon's sockets (serve_limits.go).
	srv := httpapi.NewServer(httpapi.Config{Bus: b, MaxBody: cfg.MaxBody, Log: d.log, Socket: "tcp", Doctor: doctorLines, Limits: httpLimits(cfg)})
	srv.BaseContext = func(net.Listener) context.Context { return runCtx }
	tcp := tcpListener(d.tcp, cfg, d.log)
	group.Add(servergroup.Server{Name: "tcp", Serve: func() error { return srv.Serve(tcp) },
		Shutdown: func(c context.Context) error { stopRun(); return srv.Shutdown(c) }})
	register := registersock.New(registerLimits(registersock.Config{Bus: b, Proc: proc, Log: d.log}, cfg))
	l := gate.Listener(d.reg, uid, "register", d.log)
	group.Add(servergroup.Server{Name: "register", Serve: func() error { return register.Serve(l) }, Shutdown: register.Shutdown})
	for _, p := range pullers {
		done := make(chan struct{})
		group.Add(servergroup.Server{Name: "pull " + p.Peer,
			Serve: func() error { defer close(done); p.Run(runCtx); return nil },
			Shutdown: func(c context.Context) error {
				stopRun()
				select {
				case <-done:
					return nil
				case <-c.Done():
					return c.Err()
				}
			}})
	}
	d.fed.node.StartReload()

	status := func() {
		c, _ := b.Counts()
		d.notify.Status(fmt.Sprintf("leaf serving: %d registrations, %d connections, %d messages, %d queued", b.Registrations(), register.Conns(), c.Messages, c.Queued))
	}
	return d.run(ctx, &group, status, "serving", "mode", "leaf", "principal", d.id.Principal, "service", "svc:"+d.id.Service,
		"hubs", d.hubs, "db", cfg.DBPath, "host_label", cfg.HostLabel)
}
