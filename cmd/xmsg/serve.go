package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/agentsock"
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

// serve runs the daemon. The startup order is fixed (DESIGN.md §2) and each step depends on
// the one before: credentials and the store are opened while the whole filesystem is still
// reachable, the notify socket is connected before Landlock could forbid it, and the sandbox
// is applied before the first byte from a client is read.
func serve(args []string, stdout io.Writer) error {
	// 1. Configuration and credentials.
	cfg, err := config.Parse(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		config.Usage(stdout)
		return nil
	}
	if err != nil {
		return usageError{err.Error()}
	}
	log := newLogger(cfg.LogLevel, os.Stderr)
	facts := doctor.Facts{Daemon: true, PeerGate: true, TCPListen: cfg.Listen, Systemd: os.Getenv("INVOCATION_ID") != ""}
	credSource, err := loadCredentials(cfg, log)
	if err != nil {
		return err
	}
	facts.Credentials = string(credSource)

	// 2. The store. A second daemon on the same file fails here after one second.
	st, err := store.Open(cfg.DBPath, time.Second)
	if err != nil {
		return err
	}
	defer st.Close()

	// 3. Sockets: inherited from systemd, or bound here.
	paths, err := socketPaths(cfg)
	if err != nil {
		return err
	}
	socks, err := activation.Acquire(paths)
	if err != nil {
		return err
	}
	defer socks.Close()
	facts.SocketActivation, facts.Missing = socks.Activated, socks.Missing
	if !socks.Activated {
		facts.SocketDir = filepath.Dir(paths.HTTP)
	}
	for _, name := range socks.Missing {
		log.Warn("socket not passed by systemd; not served", "socket", name)
	}
	var tcp net.Listener
	if cfg.Listen != "" {
		// Bound before the sandbox, which refuses TCP binds; no peer check (PROTOCOL.md §2.3).
		if tcp, err = net.Listen("tcp", cfg.Listen); err != nil {
			return fmt.Errorf("listen %s: %w", cfg.Listen, err)
		}
		defer tcp.Close()
		facts.TCPListen = tcp.Addr().String()
		log.Warn("tcp listener without peer check", "addr", tcp.Addr().String())
	}

	// 4. sd_notify, connected now: after Landlock scoping an abstract socket would be out of reach.
	facts.Watchdog = notify.WatchdogInterval()
	n, err := notify.Open()
	if err != nil {
		return err
	}
	defer n.Close()
	facts.Notify = n.Enabled()

	// 4b. The exe attestation helper: Landlock will deny this process /proc/<pid>/exe of
	// processes outside its domain, so a helper started now (outside the domain) reads it.
	var exe func(int) (string, error)
	if len(cfg.SvcExe) > 0 && runtime.GOOS == "linux" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("exe helper: %w", err)
		}
		helper, err := exehelper.Start(self, os.Environ())
		if err != nil {
			return err
		}
		defer helper.Close()
		exe = helper.Exe
	}

	// 5. Landlock. Its rules need an open directory, so a session directory that does not
	// exist yet would stay unreadable for the daemon's lifetime: create missing ones now
	// (0700, like Claude would) so that a session started later is found.
	for _, dir := range cfg.SessionsDirs {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				log.Warn("session dir missing and not creatable; sessions there stay invisible", "dir", dir, "err", err)
			} else {
				log.Info("session dir created", "dir", dir)
			}
		}
	}
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
	if d := creds.Dir(); d != "" {
		policy.ReadOnly = append(policy.ReadOnly, d) // credential reload reads them again
	}
	report, err := sandbox.Apply(policy, log)
	if err != nil {
		return err
	}
	facts.LandlockABI = report.ABI
	facts.Landlock = report.String()
	log.Info(report.String())
	// Trust, but verify: probe from inside that the restrictions reported are in force.
	check, err := sandbox.SelfCheck(report, policy)
	if err != nil {
		if cfg.RequireLandlock {
			return err
		}
		log.Warn("landlock self-check failed", "err", err)
	} else {
		log.Info(check)
	}
	for _, line := range facts.Lines() {
		log.Info("protection", "status", line)
	}

	// 6. Serve.
	proc := peercred.Proc{}
	uid := uint32(os.Geteuid())
	b := bus.New(bus.Config{
		Host: cfg.HostLabel, MaxBody: cfg.MaxBody, ReplyTTL: cfg.ReplyTTL, IdemTTL: cfg.IdempotencyTTL,
		SvcExe: cfg.SvcExe, Store: st, Proc: proc, Exe: exe, Log: log,
		Claude: &claude.Scanner{Dirs: cfg.SessionsDirs, Proc: proc, UID: int(uid), Log: log},
	})
	defer b.Close()
	doctorLines := func() []string { return facts.Lines() }
	// Cancelled when the stop begins, so HTTP long-polls answer at once instead of holding
	// the drain until its deadline.
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	defer stopHTTP()
	var servers []func(context.Context) error
	var wg sync.WaitGroup
	start := func(name string, fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, http.ErrServerClosed) {
				log.Error("server stopped", "socket", name, "err", err)
			}
		}()
	}
	if socks.HTTP != nil {
		srv := httpapi.NewServer(httpapi.Config{Bus: b, MaxBody: cfg.MaxBody, Log: log, Socket: "http", Doctor: doctorLines})
		srv.BaseContext = func(net.Listener) context.Context { return httpCtx }
		l := gate.Listener(socks.HTTP, uid, "http", log)
		start("http", func() error { return srv.Serve(l) })
		servers = append(servers, srv.Shutdown)
	}
	if tcp != nil {
		srv := httpapi.NewServer(httpapi.Config{Bus: b, MaxBody: cfg.MaxBody, Log: log, Socket: "tcp", Doctor: doctorLines})
		srv.BaseContext = func(net.Listener) context.Context { return httpCtx }
		start("tcp", func() error { return srv.Serve(tcp) })
		servers = append(servers, srv.Shutdown)
	}
	var agent *agentsock.Server
	if socks.Agent != nil {
		agent = agentsock.New(agentsock.Config{Bus: b, Proc: proc, Log: log, Host: cfg.HostLabel,
			MaxLine: cfg.AgentMaxLine, MaxFrame: cfg.MaxBody*6 + 4096, MaxConns: cfg.AgentMaxConns, IdleTimeout: cfg.AgentIdleTimeout, WriteTimeout: cfg.AgentWriteTimeout})
		l := gate.Listener(socks.Agent, uid, "agent", log)
		start("agent", func() error { return agent.Serve(l) })
		servers = append(servers, agent.Shutdown)
	}
	var register *registersock.Server
	if socks.Register != nil {
		register = registersock.New(registersock.Config{Bus: b, Proc: proc, Log: log})
		l := gate.Listener(socks.Register, uid, "register", log)
		start("register", func() error { return register.Serve(l) })
		servers = append(servers, register.Shutdown)
	}
	// Every listener was listening before this point (bound or inherited), so each socket
	// accepts now: connections queue in the kernel backlog until Serve picks them up.
	log.Info("serving", "db", cfg.DBPath, "host_label", cfg.HostLabel, "services", cfg.SvcNames())
	n.Ready()

	status := func() {
		c, _ := b.Counts()
		conns := 0
		if agent != nil {
			conns += agent.Conns()
		}
		if register != nil {
			conns += register.Conns()
		}
		n.Status(fmt.Sprintf("serving: %d registrations, %d connections, %d messages, %d queued", b.Registrations(), conns, c.Messages, c.Queued))
	}
	status()
	tick := 10 * time.Second
	if facts.Watchdog > 0 && facts.Watchdog/2 < tick {
		tick = facts.Watchdog / 2
	}
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	for {
		select {
		case <-ticker.C:
			status()
			if facts.Watchdog > 0 {
				n.Watchdog()
			}
			continue
		case sig := <-sigs:
			log.Info("stopping", "signal", sig.String())
		}
		break
	}

	// 7. Stop: tell systemd, stop accepting, drain in-flight requests (bounded).
	n.Stopping()
	stopHTTP()
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	for _, shutdown := range servers {
		if err := shutdown(ctx); err != nil {
			log.Warn("drain incomplete", "err", err)
		}
	}
	wg.Wait()
	log.Info("stopped")
	return nil
}

func socketPaths(cfg *config.Config) (activation.Paths, error) {
	p := activation.Paths{HTTP: cfg.HTTPSock, Agent: cfg.AgentSock, Register: cfg.RegisterSock}
	if p.HTTP != "" && p.Agent != "" && p.Register != "" {
		return p, nil
	}
	def, err := activation.DefaultPaths()
	if err != nil {
		// Under socket activation the paths are not used (unless LISTEN_PID names another
		// process, and then Acquire falls back to binding and refuses the empty paths).
		if os.Getenv("LISTEN_FDS") != "" {
			return p, nil
		}
		return p, err
	}
	if p.HTTP == "" {
		p.HTTP = def.HTTP
	}
	if p.Agent == "" {
		p.Agent = def.Agent
	}
	if p.Register == "" {
		p.Register = def.Register
	}
	return p, nil
}

// loadCredentials reads and validates the federation credentials, from
// $CREDENTIALS_DIRECTORY (LoadCredential=) or the plain-path flags. Federation itself is not
// in this build; the credentials are still checked at start so a bad deployment shows now,
// and only their fingerprints are logged, never their content.
func loadCredentials(cfg *config.Config, log *slog.Logger) (creds.Source, error) {
	source := creds.Source("none")
	read := func(name, path string) ([]byte, error) {
		raw, src, err := creds.Read(name, path)
		if err != nil {
			return nil, err
		}
		if raw != nil {
			source = src
		}
		return raw, nil
	}
	cert, err := read("fed-cert", cfg.FedCert)
	if err != nil {
		return source, err
	}
	key, err := read("fed-key", cfg.FedKey)
	if err != nil {
		return source, err
	}
	ca, err := read("fed-ca", cfg.FedCA)
	if err != nil {
		return source, err
	}
	peers, err := read("peers", cfg.PeersFile)
	if err != nil {
		return source, err
	}
	if (cert == nil) != (key == nil) {
		return source, errors.New("credentials: fed-cert and fed-key must be given together")
	}
	if cert != nil {
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return source, fmt.Errorf("credentials: fed-cert/fed-key: %v", err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return source, fmt.Errorf("credentials: fed-cert: %v", err)
		}
		pin := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
		log.Info("credential loaded", "name", "fed-cert", "source", string(source), "pin", "sha256:"+hex.EncodeToString(pin[:]))
	}
	if ca != nil {
		if b, _ := pem.Decode(ca); b == nil {
			return source, errors.New("credentials: fed-ca: no PEM block")
		}
		log.Info("credential loaded", "name", "fed-ca", "source", string(source))
	}
	if peers != nil {
		if !json.Valid(peers) {
			return source, errors.New("credentials: peers: not valid JSON")
		}
		log.Info("credential loaded", "name", "peers", "source", string(source))
	}
	return source, nil
}
