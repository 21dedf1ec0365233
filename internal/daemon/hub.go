package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/agentsock"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
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

// The steps of the normal daemon (the hub of its tier): http.sock, agent.sock and
// register.sock, the optional TCP listener and the federation listener.

// loadCredentials is step 1: the federation credentials, checked now so that a bad
// deployment fails at start.
func (d *Daemon) loadCredentials() error {
	d.facts = doctor.Facts{Daemon: true, PeerGate: true, TCPListen: d.cfg.Listen, Systemd: os.Getenv("INVOCATION_ID") != ""}
	src, fed, err := loadCredentials(d.cfg, d.log)
	d.facts.Credentials, d.fed = string(src), fed
	return err
}

// openStore is step 2. A second daemon on the same file fails here after one second; a file
// that is damaged, no xmsg store or of a newer format fails with a *store.RefusedError, which
// xmsg serve exits on with its own status (docs/operations.md).
func (d *Daemon) openStore() error {
	st, err := store.Open(d.cfg.DBPath, time.Second)
	if err != nil {
		return err
	}
	if from := st.MigratedFrom(); from != store.Format {
		d.log.Info("store migrated", "db", d.cfg.DBPath, "from_format", from, "format", store.Format)
	}
	d.store = st
	d.onClose(st.Close)
	return nil
}

// acquireSockets is step 3: the sockets inherited from systemd, or bound here; and the
// optional TCP listener, bound now because the sandbox refuses TCP binds later.
func (d *Daemon) acquireSockets() error {
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
	if socks.HandedOver != "" {
		d.facts.Relaunched = socks.HandedOver
		d.log.Info("sockets handed over by the daemon this one replaced", "reason", "session dir appeared", "dir", socks.HandedOver)
	}
	for _, name := range socks.Missing {
		d.log.Warn("socket not passed by systemd; not served", "socket", name)
	}
	if d.cfg.Listen != "" {
		if err := d.listenTCP(); err != nil {
			return err
		}
	}
	d.listenReports()
	return d.fed.listen(d.onClose)
}

// listenReports binds the reply socket Claude Code sessions report held messages to, where
// Claude Code puts inbox sockets (docs/protocol.md §6.3). Without it deliveries go on, and
// their records say only that the line was written. A daemon in a test process shares the
// process's pid (the socket's name) with others, so only a daemon of its own binds one.
func (d *Daemon) listenReports() {
	if d.c.InProcess {
		return
	}
	path := claude.ReportPath(os.Getenv("XDG_RUNTIME_DIR"))
	r, err := claude.ListenReports(path, d.log)
	if err != nil {
		d.log.Warn("claude reply socket not bound; held messages are not reported", "socket", path, "err", err)
		d.facts.ClaudeReports = "none: " + err.Error()
		return
	}
	d.reports = r
	d.onClose(ignoreClosed(r.Close))
	d.facts.ClaudeReports = path + " (Claude Code sessions report held messages there)"
}

// listenTCP binds --listen. No peer check on TCP (docs/protocol.md §2.3): the address is the
// operator's choice.
func (d *Daemon) listenTCP() error {
	tcp, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", d.cfg.Listen, err)
	}
	d.tcp = tcp
	d.onClose(ignoreClosed(tcp.Close))
	d.facts.TCPListen = tcp.Addr().String()
	d.log.Warn("tcp listener without peer check", "addr", tcp.Addr().String())
	return nil
}

// openNotify is step 4: sd_notify, connected now, because after Landlock's scoping an
// abstract notify socket would be out of reach.
func (d *Daemon) openNotify() error {
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
func (d *Daemon) startExeHelper() error {
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
	d.exe, d.files, d.sum = helper.Exe, helper.OpenFiles, helper.ExeDigest
	return nil
}

// applySandbox is step 5: Landlock, then a self-check from inside that what is reported is
// in force.
func (d *Daemon) applySandbox() error {
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
	if d.reports != nil {
		// The reply socket's file is removed at stop, as the self-bound sockets are.
		policy.RemoveFiles = append(policy.RemoveFiles, filepath.Dir(d.reports.Path()))
	}
	if dir := creds.Dir(); dir != "" {
		policy.ReadOnly = append(policy.ReadOnly, dir) // credential reload reads them again
	}
	d.fed.restrict(&policy)
	d.restrictCustody(&policy)
	_, err := d.sandbox(policy)
	return err
}

// sandbox applies policy, logs what is enforced, proves it from inside (the self-check: a
// report that says "enforced" is trusted only once a denied access was seen), and logs every
// protection line. With --require-landlock a failed self-check is a failed start.
func (d *Daemon) sandbox(policy sandbox.Policy) (sandbox.Report, error) {
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
func (d *Daemon) prepareSessionDirs() {
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

// buildServers is step 6 up to serving: the bus, and one server per socket in the group.
func (d *Daemon) buildServers() error {
	cfg := d.cfg
	if !d.c.InProcess {
		tuneGC(d.runCtx)
	}
	proc := peercred.Proc{}
	uid := uint32(os.Geteuid())
	sessions := &claude.Scanner{Dirs: cfg.SessionsDirs, Proc: proc, UID: int(uid), Log: d.log}
	d.onClose(func() error { sessions.Close(); return nil })
	d.facts.Pidfd = reportWatchFallbacks(sessions, proc, d.log)
	events := d.buildEvents()
	mail := mailboxes(cfg, d.store, d.log)
	if mail != nil {
		mail.Events = events.stream
	}
	b := bus.New(bus.Config{
		Host: cfg.HostLabel, MaxBody: cfg.MaxBody, ReplyTTL: cfg.ReplyTTL, IdemTTL: cfg.IdempotencyTTL,
		SvcExe: cfg.SvcExe, Store: d.store, Proc: proc, Exe: d.exe, Log: d.log, Fed: d.fed.bus(d.store, mail),
		Codex: codexAttester(cfg, proc, d.exe, d.files, d.sum), Agy: agyAttester(cfg, proc, d.exe, d.files), AgySend: d.agySend,
		Claude: sessions, AckDelay: d.c.AckDelay,
		MaxWaiters: cfg.Limits.HTTPMaxWaiters, OwnSockets: ownSockets(d.socks, d.reports), ReplyTo: replyTo(d.reports),
		Bounds: busBounds(cfg),
		Events: events.stream,
	})
	d.bus = b
	d.events.setHarnesses(b.Harnesses())
	d.onClose(func() error { b.Close(); return nil })
	doctorLines := func() []string {
		f := d.facts
		f.SessionWatch = sessions.WatchReport() // as of now: a watch can fail, a directory be recreated
		lines := append(f.Lines(), storeLine(d.store.Info()))
		if w := b.Claude().Waiting(); len(w) > 0 {
			lines = append(lines, "claude sessions waiting for their user (peer messages to them are held until the person decides; "+
				`a session that bypasses permission prompts takes xmsg's mail with "crossSessionInbound": "accept" in its settings): `+strings.Join(w, ", "))
		}
		return append(lines, d.fed.doctor()...)
	}
	if d.socks.HTTP != nil {
		d.addHTTP("http", httpListener(gate.Listener(d.socks.HTTP, uid, "http", d.log), cfg, d.log), doctorLines)
	}
	if d.tcp != nil {
		d.addHTTP("tcp", tcpListener(d.tcp, cfg, d.log), doctorLines)
	}
	var conns []func() int
	if d.socks.Agent != nil {
		ac := agentLimits(agentsock.Config{Bus: b, Proc: proc, Log: d.log, Host: cfg.HostLabel,
			MaxLine: cfg.AgentMaxLine, MaxFrame: cfg.MaxBody*6 + 4096, MaxConns: cfg.AgentMaxConns,
			IdleTimeout: cfg.AgentIdleTimeout, WriteTimeout: cfg.AgentWriteTimeout, Custody: d.custody}, cfg)
		if d.c.Agent != nil {
			d.c.Agent(&ac)
		}
		d.agent = agentsock.New(ac)
		l := gate.Listener(d.socks.Agent, uid, "agent", d.log)
		d.group.Add(servergroup.Server{Name: "agent", Serve: func() error { return d.agent.Serve(l) }, Shutdown: d.agent.Shutdown})
		conns = append(conns, d.agent.Conns)
	}
	if d.socks.Register != nil {
		d.addRegister(gate.Listener(d.socks.Register, uid, "register", d.log))
		conns = append(conns, d.register.Conns)
	}
	d.fed.serve(b, d.runCtx, d.group.Add, d.onClose)
	if d.reports != nil {
		go d.reports.Serve(b.Claude().Report) // ends when the socket closes (onClose)
	}
	go d.reloadCustody(d.runCtx)
	d.status = func() string {
		c, _ := b.Counts()
		n := 0
		for _, f := range conns {
			n += f()
		}
		return fmt.Sprintf("serving: %d registrations, %d connections, %d messages, %d queued", c.Registrations, n, c.Messages, c.Queued)
	}
	d.serving = []any{"db", cfg.DBPath, "host_label", cfg.HostLabel, "services", cfg.SvcNames()}
	return nil
}

// addHTTP adds an HTTP API server on l (http.sock or TCP) to the group. Its requests'
// context ends when the stop begins, so long-polls answer at once instead of holding the
// drain until its deadline.
func (d *Daemon) addHTTP(name string, l net.Listener, doctorLines func() []string) {
	lines := func() []string { return append(doctorLines(), d.events.tier.doctorLines()...) }
	cfg := httpapi.Config{Bus: d.bus, MaxBody: d.cfg.MaxBody, Log: d.log, Socket: name, Doctor: d.custodyDoctor(name, lines), Limits: httpLimits(d.cfg),
		Tier: d.events.tier}
	if d.leaf != nil {
		cfg.Leaf = &d.leaf.id
	}
	if name == "http" {
		// http.sock only: its peers passed the gate. The TCP listener has no peer check.
		cfg.Backup = d.store.Backup
	}
	srv := httpapi.NewServer(cfg)
	srv.BaseContext = func(net.Listener) context.Context { return d.runCtx }
	d.group.Add(servergroup.Server{Name: name, Serve: func() error { return srv.Serve(l) },
		Shutdown: func(c context.Context) error { d.stopRun(); return srv.Shutdown(c) }})
}

// addRegister adds the register.sock server on l (a gate.Listener) to the group.
func (d *Daemon) addRegister(l net.Listener) {
	rc := registerLimits(registersock.Config{Bus: d.bus, Proc: peercred.Proc{}, Log: d.log, Custody: d.custody}, d.cfg)
	if d.c.Register != nil {
		d.c.Register(&rc)
	}
	d.register = registersock.New(rc)
	d.group.Add(servergroup.Server{Name: "register", Serve: func() error { return d.register.Serve(l) }, Shutdown: d.register.Shutdown})
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

// storeLine is the doctor line of the store: its file, format, size and last backup.
func storeLine(in store.Info) string {
	last := "never (xmsg backup FILE makes one)"
	if !in.LastBackup.IsZero() {
		last = in.LastBackup.Format(time.RFC3339)
	}
	return fmt.Sprintf("store: %s, format %d, %d bytes, last backup %s", in.Path, in.Format, in.Size, last)
}

// replyTo is the reply address of r, "" without one.
func replyTo(r *claude.Reports) string {
	if r == nil {
		return ""
	}
	return claude.Address(r.Path())
}
