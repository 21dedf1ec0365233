package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/agentsock"
	"github.com/xmsg/xmsg/internal/agy"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/creds"
	"github.com/xmsg/xmsg/internal/doctor"
	"github.com/xmsg/xmsg/internal/exehelper"
	"github.com/xmsg/xmsg/internal/gate"
	"github.com/xmsg/xmsg/internal/httpapi"
	"github.com/xmsg/xmsg/internal/notify"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/registersock"
	"github.com/xmsg/xmsg/internal/sandbox"
	"github.com/xmsg/xmsg/internal/servergroup"
	"github.com/xmsg/xmsg/internal/store"
)

// drainTimeout bounds the graceful stop on SIGTERM; systemd's TimeoutStopSec is longer.
const drainTimeout = 5 * time.Second

func newLogger(level string, w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lvl}
	// journald stamps every line itself; a second timestamp is noise.
	if os.Getenv("JOURNAL_STREAM") != "" {
		opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// instance is one `xmsg serve` while it starts, serves and stops. Each startup step is one
// method; what a step opens is closed by close, in reverse order.
type instance struct {
	cfg   *config.Config
	log   *slog.Logger
	facts doctor.Facts

	store   *store.Store
	socks   *activation.Sockets
	tcp     net.Listener
	notify  *notify.Notifier
	exe     func(pid int) (string, error)                              // nil: no service executables to attest
	files   func(pid int) ([]peercred.OpenFile, error)                 // the helper's; nil: read /proc directly
	agySend func(agy.Credentials, string, string) (agy.Outcome, error) // nil: agy not configured
	fed     *federation                                                // serve_fed.go; its methods are no-ops without federation

	closers []func() error
}

// serve runs the daemon. The startup order is fixed (docs/design.md §2) and each step depends on
// the one before: credentials and the store are opened while the whole filesystem is still
// reachable, the notify socket is connected before Landlock could forbid it, and the sandbox
// is applied before the first byte from a client is read.
func serve(args []string, stdout io.Writer) error {
	// Signals are caught from the first line: a SIGTERM that arrives during startup ends it
	// between two steps, with everything opened so far closed again, instead of killing the
	// process half-started (and, once the notify socket is open, it says STOPPING=1).
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	cfg, err := config.Parse(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		config.Usage(stdout)
		return nil
	}
	if err != nil {
		return usageError{err.Error()}
	}
	if cfg.Leaf {
		return serveLeaf(ctx, cfg) // serve_leaf.go
	}
	d := &instance{cfg: cfg, log: newLogger(cfg.LogLevel, os.Stderr)}
	d.facts = doctor.Facts{Daemon: true, PeerGate: true, TCPListen: cfg.Listen, Systemd: os.Getenv("INVOCATION_ID") != ""}
	defer d.close()

	started, err := d.start(ctx, []step{
		{"credentials", d.loadCredentials}, // 1. configuration (above) and credentials
		{"store", d.openStore},             // 2.
		{"sockets", d.acquireSockets},      // 3.
		{"notify", d.openNotify},           // 4.
		{"exe helper", d.startExeHelper},   // 4b.
		{"agy helper", d.startAgyHelper},   // 4c.
		{"sandbox", d.applySandbox},        // 5.
	})
	if !started {
		return err
	}
	return d.serve(ctx) // 6. and 7.
}

// step is one startup step of docs/design.md §2.
type step struct {
	name string
	run  func() error
}

// start runs the startup steps in order. It stops at the first error, or between two steps
// when ctx is done (a SIGTERM during startup): then nothing more is opened, STOPPING=1 is
// said if the notify socket is open, and the daemon exits 0. started is true when every step
// ran and the daemon should serve.
func (d *instance) start(ctx context.Context, steps []step) (started bool, err error) {
	for _, s := range steps {
		if err := s.run(); err != nil {
			return false, err
		}
		if ctx.Err() != nil {
			d.log.Info("stopped during startup", "after", s.name)
			if d.notify != nil {
				d.notify.Stopping()
			}
			return false, nil
		}
	}
	return true, nil
}

// onClose queues fn for close, which runs the queue in reverse order.
func (d *instance) onClose(fn func() error) { d.closers = append(d.closers, fn) }

func (d *instance) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		if err := d.closers[i](); err != nil {
			d.log.Warn("close", "err", err)
		}
	}
}

// loadCredentials is step 1: the federation credentials, checked now so that a bad
// deployment fails at start.
func (d *instance) loadCredentials() error {
	src, fed, err := loadCredentials(d.cfg, d.log)
	d.facts.Credentials, d.fed = string(src), fed
	return err
}

// openStore is step 2. A second daemon on the same file fails here after one second.
func (d *instance) openStore() error {
	st, err := store.Open(d.cfg.DBPath, time.Second)
	if err != nil {
		return err
	}
	d.store = st
	d.onClose(st.Close)
	return nil
}

// acquireSockets is step 3: the sockets inherited from systemd, or bound here; and the
// optional TCP listener, bound now because the sandbox refuses TCP binds later.
func (d *instance) acquireSockets() error {
	paths, err := activation.ResolvePaths(activation.Paths{HTTP: d.cfg.HTTPSock, Agent: d.cfg.AgentSock, Register: d.cfg.RegisterSock})
	if err != nil {
		return err
	}
	socks, err := activation.Acquire(paths)
	if err != nil {
		return err
	}
	d.socks = socks
	d.onClose(socks.Close)
	d.facts.SocketActivation, d.facts.Missing = socks.Activated, socks.Missing
	if !socks.Activated {
		d.facts.SocketDir = filepath.Dir(paths.HTTP)
	}
	for _, name := range socks.Missing {
		d.log.Warn("socket not passed by systemd; not served", "socket", name)
	}
	if d.cfg.Listen != "" {
		// No peer check on TCP (docs/protocol.md §2.3): the address is the operator's choice.
		tcp, err := net.Listen("tcp", d.cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen %s: %w", d.cfg.Listen, err)
		}
		d.tcp = tcp
		d.onClose(ignoreClosed(tcp.Close))
		d.facts.TCPListen = tcp.Addr().String()
		d.log.Warn("tcp listener without peer check", "addr", tcp.Addr().String())
	}
	if err := d.fed.listen(d.onClose); err != nil {
		return err
	}
	return nil
}

// openNotify is step 4: sd_notify, connected now, because after Landlock's scoping an
// abstract notify socket would be out of reach.
func (d *instance) openNotify() error {
	d.facts.Watchdog = notify.WatchdogInterval()
	n, err := notify.Open()
	if err != nil {
		return err
	}
	d.notify = n
	d.onClose(n.Close)
	d.facts.Notify = n.Enabled()
	return nil
}

// startExeHelper is step 4b: Landlock will deny this process /proc/<pid>/exe of processes
// outside its domain, so a helper started now (outside the domain) reads it for service
// attestation.
func (d *instance) startExeHelper() error {
	if !needsExeHelper(d.cfg) || runtime.GOOS != "linux" {
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("exe helper: %w", err)
	}
	helper, err := exehelper.Start(self, os.Environ())
	if err != nil {
		return err
	}
	d.onClose(helper.Close)
	d.exe, d.files = helper.Exe, helper.OpenFiles
	return nil
}

// applySandbox is step 5: Landlock, then a self-check from inside that what is reported is
// in force.
func (d *instance) applySandbox() error {
	d.prepareSessionDirs()
	cfg := d.cfg
	policy := sandbox.Policy{
		ReadWrite: []string{filepath.Dir(cfg.DBPath)}, // bbolt file, its lock and growth
		ReadOnly:  append([]string{"/proc"}, cfg.SessionsDirs...),
		// Claude inbox sockets live wherever a session file says (messagingSocketPath), so
		// connecting to pathname sockets stays allowed everywhere: on kernels whose Landlock
		// governs such connects (ABI 9+), denying them would break every delivery. Reading,
		// writing and creating files stay denied outside the paths above.
		ConnectUnix: []string{"/"},
		Require:     cfg.RequireLandlock,
	}
	if !d.socks.Activated && d.facts.SocketDir != "" {
		// Self-bound sockets are removed at stop; removing is all that is allowed there
		// (under socket activation the socket units own the files).
		policy.RemoveFiles = []string{d.facts.SocketDir}
	}
	policy.ReadOnly = append(policy.ReadOnly, attestationDirs(cfg, d.log)...)
	if dir := creds.Dir(); dir != "" {
		policy.ReadOnly = append(policy.ReadOnly, dir) // credential reload reads them again
	}
	d.fed.restrict(&policy)
	_, err := d.sandbox(policy)
	return err
}

// sandbox applies policy, logs what is enforced, proves it from inside (the self-check: a
// report that says "enforced" is trusted only once a denied access was seen), and logs every
// protection line. With --require-landlock a failed self-check is a failed start.
func (d *instance) sandbox(policy sandbox.Policy) (sandbox.Report, error) {
	report, err := sandbox.Apply(policy, d.log)
	if err != nil {
		return report, err
	}
	d.facts.LandlockABI = report.ABI
	d.facts.Landlock = report.String()
	d.log.Info(report.String())
	if check, err := sandbox.SelfCheck(report, policy); err != nil {
		if d.cfg.RequireLandlock {
			return report, err
		}
		d.log.Warn("landlock self-check failed", "err", err)
	} else {
		d.log.Info(check)
	}
	for _, line := range d.facts.Lines() {
		d.log.Info("protection", "status", line)
	}
	return report, nil
}

// prepareSessionDirs creates missing session directories before the sandbox: a Landlock
// rule needs an open directory, so one that does not exist now would stay unreadable for
// the daemon's lifetime. Only the last component is created (0700, as Claude would), and
// only inside an existing parent owned by the daemon's uid: a daemon running as root must
// not build a directory tree from a mistyped path, and a directory made inside somebody
// else's directory would be theirs to swap.
func (d *instance) prepareSessionDirs() {
	for _, dir := range d.cfg.SessionsDirs {
		if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := createSessionDir(dir); err != nil {
			d.log.Warn("session dir missing and not created; sessions there stay invisible", "dir", dir, "err", err)
			continue
		}
		d.log.Info("session dir created", "dir", dir)
	}
}

// serve is steps 6 and 7: build the bus, serve every socket as one server group, send
// READY=1 once all of them run, keep STATUS= current, and on SIGTERM say STOPPING=1 and
// drain. It returns an error, and so the daemon exits non-zero, when a server fails.
func (d *instance) serve(ctx context.Context) error {
	cfg := d.cfg
	tuneGC()
	proc := peercred.Proc{}
	uid := uint32(os.Geteuid())
	sessions := &claude.Scanner{Dirs: cfg.SessionsDirs, Proc: proc, UID: int(uid), Log: d.log}
	defer sessions.Close()
	d.facts.Pidfd = reportWatchFallbacks(sessions, proc, d.log)
	b := bus.New(bus.Config{
		Host: cfg.HostLabel, MaxBody: cfg.MaxBody, ReplyTTL: cfg.ReplyTTL, IdemTTL: cfg.IdempotencyTTL,
		SvcExe: cfg.SvcExe, Store: d.store, Proc: proc, Exe: d.exe, Log: d.log, Fed: d.fed.bus(),
		Codex: codexAttester(cfg, proc, d.exe, d.files), Agy: agyAttester(cfg, proc, d.exe, d.files), AgySend: d.agySend,
		Claude: sessions, AckDelay: testAckDelay(),
		MaxWaiters: cfg.Limits.HTTPMaxWaiters, OwnSockets: ownSockets(d.socks),
		Bounds: busBounds(cfg),
	})
	defer b.Close()
	doctorLines := func() []string {
		f := d.facts
		f.SessionWatch = sessions.WatchReport() // as of now: a watch can fail, a directory be recreated
		return append(f.Lines(), d.fed.doctor()...)
	}
	// Cancelled when the stop begins, so HTTP long-polls answer at once instead of holding
	// the drain until its deadline.
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	defer stopHTTP()

	group := servergroup.Group{Drain: drainTimeout}
	addHTTP := func(name string, l net.Listener) {
		srv := httpapi.NewServer(httpapi.Config{Bus: b, MaxBody: cfg.MaxBody, Log: d.log, Socket: name, Doctor: doctorLines, Limits: httpLimits(cfg)})
		srv.BaseContext = func(net.Listener) context.Context { return httpCtx }
		group.Add(servergroup.Server{Name: name, Serve: func() error { return srv.Serve(l) },
			Shutdown: func(c context.Context) error { stopHTTP(); return srv.Shutdown(c) }})
	}
	if d.socks.HTTP != nil {
		addHTTP("http", httpListener(gate.Listener(d.socks.HTTP, uid, "http", d.log), cfg, d.log))
	}
	if d.tcp != nil {
		addHTTP("tcp", tcpListener(d.tcp, cfg, d.log))
	}
	var conns []func() int
	if d.socks.Agent != nil {
		agent := agentsock.New(agentLimits(agentsock.Config{Bus: b, Proc: proc, Log: d.log, Host: cfg.HostLabel,
			MaxLine: cfg.AgentMaxLine, MaxFrame: cfg.MaxBody*6 + 4096, MaxConns: cfg.AgentMaxConns,
			IdleTimeout: cfg.AgentIdleTimeout, WriteTimeout: cfg.AgentWriteTimeout}, cfg))
		l := gate.Listener(d.socks.Agent, uid, "agent", d.log)
		group.Add(servergroup.Server{Name: "agent", Serve: func() error { return agent.Serve(l) }, Shutdown: agent.Shutdown})
		conns = append(conns, agent.Conns)
	}
	if d.socks.Register != nil {
		register := registersock.New(registerLimits(registersock.Config{Bus: b, Proc: proc, Log: d.log}, cfg))
		l := gate.Listener(d.socks.Register, uid, "register", d.log)
		group.Add(servergroup.Server{Name: "register", Serve: func() error { return register.Serve(l) }, Shutdown: register.Shutdown})
		conns = append(conns, register.Conns)
	}
	d.fed.serve(b, httpCtx, group.Add, d.onClose)
	if group.Len() == 0 {
		return errors.New("serve: no socket to serve (systemd passed none of http, agent, register)")
	}

	status := func() {
		c, _ := b.Counts()
		n := 0
		for _, f := range conns {
			n += f()
		}
		d.notify.Status(fmt.Sprintf("serving: %d registrations, %d connections, %d messages, %d queued", b.Registrations(), n, c.Messages, c.Queued))
	}
	return d.run(ctx, &group, status, "serving", "db", cfg.DBPath, "host_label", cfg.HostLabel, "services", cfg.SvcNames())
}

// run serves group until ctx is done or a server fails: once every server runs it logs the
// serving line (msg and args), sends READY=1 and starts the STATUS=/watchdog ticker; when
// the stop begins it says STOPPING=1, before the drain. Its error is the daemon's exit.
func (d *instance) run(ctx context.Context, group *servergroup.Group, status func(), msg string, args ...any) error {
	// The status ticker stops with the group, whichever way it stops.
	tickCtx, stopTicks := context.WithCancel(ctx)
	defer stopTicks()
	readyFailed := false // then the notify socket is unusable: no STOPPING=1 either
	group.Started = func() error {
		// Every listener was listening before this point (bound or inherited), so each
		// socket accepts now: connections queue in the kernel backlog until Serve runs.
		d.log.Info(msg, args...)
		// systemd waits for READY=1 (Type=notify); one that does not arrive would leave the
		// unit "activating" until it times out, so a failed send is a failed start.
		if err := d.notify.Ready(); err != nil {
			readyFailed = true
			return fmt.Errorf("serve: %w", err)
		}
		status()
		go d.tick(tickCtx, status)
		return nil
	}
	group.Stopping = func() {
		stopTicks()
		if ctx.Err() != nil {
			d.log.Info("stopping", "reason", "signal")
		}
		if !readyFailed {
			d.notify.Stopping()
		}
	}
	if err := group.Run(ctx); err != nil {
		d.log.Error("stopped with an error", "err", err)
		return err
	}
	d.log.Info("stopped")
	return nil
}

// tick keeps STATUS= current and pets the watchdog (at half its interval) until ctx ends.
func (d *instance) tick(ctx context.Context, status func()) {
	every := 10 * time.Second
	if w := d.facts.Watchdog; w > 0 && w/2 < every {
		every = w / 2
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			status()
			if d.facts.Watchdog > 0 {
				d.notify.Watchdog()
			}
		}
	}
}

// ignoreClosed makes closing an already closed listener a no-op: servers close their
// listeners on shutdown, and the daemon closes them again on the way out.
func ignoreClosed(close func() error) func() error {
	return func() error {
		if err := close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	}
}

// createSessionDir makes dir (0700) when its parent exists and belongs to the daemon's uid.
func createSessionDir(dir string) error {
	parent := filepath.Dir(dir)
	fi, err := os.Stat(parent)
	if err != nil {
		return fmt.Errorf("parent: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("parent %s is not a directory owned by uid %d", parent, os.Geteuid())
	}
	return os.Mkdir(dir, 0o700)
}
