// Package daemon is the one assembly of the xmsg daemon: a Config in; Start (the startup steps
// of docs/design.md §2, in order), Run (the servers as one group until the context ends or a
// server fails) and Close (everything opened, closed in reverse order) out. `xmsg serve` is its
// one caller in the binary; the test support (internal/daemontest) starts the same assembly in
// its own process, so a test daemon has exactly the bounds, bus settings and servers of a real
// one.
//
// Startup is a table of named steps (steps): each step is one method, and what it opens is
// queued for Close. Leaf mode (docs/protocol.md §7.5, leaf.go) replaces the entries that differ
// and keeps the rest, so adding a step to the daemon is one entry in that table.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/agentsock"
	"github.com/xmsg/xmsg/internal/agy"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/doctor"
	"github.com/xmsg/xmsg/internal/notify"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/registersock"
	"github.com/xmsg/xmsg/internal/relaunch"
	"github.com/xmsg/xmsg/internal/servergroup"
	"github.com/xmsg/xmsg/internal/store"
)

// DrainTimeout bounds the graceful stop on SIGTERM; systemd's TimeoutStopSec is longer.
const DrainTimeout = 5 * time.Second

// Config is what a daemon is made from.
type Config struct {
	*config.Config // the flags; Leaf selects leaf mode
	Log            *slog.Logger

	// InProcess says the daemon shares its process with other code (a test binary): the steps
	// that change the whole process are left out — the Landlock sandbox, sd_notify (it takes
	// NOTIFY_SOCKET from the environment), the helper processes (they re-execute this
	// binary), the GC setting. Every bound, bus setting and server is production's.
	InProcess bool
	// AckDelay holds acks uncommitted this long (bus.Config.AckDelay); a knob of the e2e
	// tests' daemon only, always 0 in xmsg.
	AckDelay time.Duration
	// RecordRide, when not 0, replaces a leaf's leaf.RecordRide (a knob of the e2e tests'
	// daemon only, always 0 in xmsg): a test kills the leaf inside a long ride.
	RecordRide time.Duration
	// Args are the `serve` arguments the daemon was started with: a relaunch (relaunch.go)
	// starts it again with them. Nil: no relaunch helper.
	Args []string
	// Agent and Register, when set, adjust a server's config after the daemon filled it from
	// the flags: for tests that probe a bound no flag sets (a 100-byte frame cap). Nil in xmsg.
	Agent    func(*agentsock.Config)
	Register func(*registersock.Config)
}

// ConfigError is a configuration the daemon refuses at start (a bad --leaf-principal): xmsg
// exits with its usage code.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// Daemon is one daemon while it starts, serves and stops. It is used by one goroutine: Start,
// then Run, then Close (always, also after a failed Start).
type Daemon struct {
	cfg   *config.Config
	c     Config
	log   *slog.Logger
	facts doctor.Facts
	leaf  *leafMode // nil: the normal daemon

	store   *store.Store
	socks   *activation.Sockets
	tcp     net.Listener
	notify  *notify.Notifier
	exe     func(pid int) (string, error)                              // nil: no service executables to attest
	files   func(pid int) ([]peercred.OpenFile, error)                 // the helper's; nil: read /proc directly
	sum     func(pid int) (string, string, error)                      // the helper's ExeDigest; nil: read /proc directly
	reports *claude.Reports                                            // the reply socket of Claude Code's peer status reports; nil: none
	agySend func(agy.Credentials, string, string) (agy.Outcome, error) // nil: agy not configured
	fed     *federation                                                // fed.go; its methods are no-ops without federation
	custody *custody.Holder                                            // custody.go; nil: no secrets held

	// The relaunch (relaunch.go).
	watch       *relaunch.Watch    // nil: session dirs not watched
	handover    *relaunch.Handover // nil: under systemd (or no helper)
	relaunchDir string             // set when a session dir ended the run

	// Built by the servers step.
	events   *events // the one event stream and its sinks (events.go)
	bus      *bus.Bus
	agent    *agentsock.Server
	register *registersock.Server
	group    servergroup.Group
	status   func() string // the STATUS= line
	serving  []any         // the "serving" log line's attributes
	runCtx   context.Context
	stopRun  context.CancelFunc // cancelled when the stop begins: long-polls answer, pulls end

	closers []func() error
}

// New returns a daemon for c; nothing is opened before Start.
func New(c Config) *Daemon {
	d := &Daemon{cfg: c.Config, c: c, log: c.Log, group: servergroup.Group{Drain: DrainTimeout}}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if c.Leaf {
		d.leaf = &leafMode{d: d}
	}
	d.runCtx, d.stopRun = context.WithCancel(context.Background())
	// A relaunched daemon's way back to its helper: taken before any child is started.
	d.handover = relaunch.Inherited()
	d.onClose(func() error { d.stopRun(); return nil })
	return d
}

// step is one startup step of docs/design.md §2.
type step struct {
	name string
	run  func() error
	// process marks a step that changes the whole process; it is left out in-process.
	process bool
}

// steps is the startup of docs/design.md §2 in its fixed order; each step depends on the one
// before: credentials and the store are opened while the whole filesystem is still reachable,
// the notify socket is connected and the helpers started before Landlock could forbid them,
// and the sandbox is applied before the first byte from a client is read. Leaf mode replaces
// the entries that differ (leafMode.replace).
func (d *Daemon) steps() []step {
	steps := []step{
		{name: "credentials", run: d.loadCredentials},                  // 1. configuration (New) and credentials
		{name: "custody", run: d.loadCustody},                          // 1b. custody secrets (custody.go)
		{name: "store", run: d.openStore},                              // 2.
		{name: "sockets", run: d.acquireSockets},                       // 3.
		{name: "notify", run: d.openNotify, process: true},             // 4.
		{name: "exe helper", run: d.startExeHelper, process: true},     // 4b.
		{name: "agy helper", run: d.startAgyHelper, process: true},     // 4c.
		{name: "session dirs", run: d.watchSessionDirs, process: true}, // 4d. the relaunch watch
		{name: "sandbox", run: d.applySandbox, process: true},          // 5.
		{name: "servers", run: d.buildServers},                         // 6. the bus and one server per socket
	}
	if d.leaf != nil {
		steps = d.leaf.replace(steps)
	}
	if d.c.InProcess {
		kept := steps[:0]
		for _, s := range steps {
			if !s.process {
				kept = append(kept, s)
			}
		}
		steps = kept
	}
	return steps
}

// Start runs the startup steps in order. It stops at the first error, or between two steps
// when ctx is done (a SIGTERM during startup): then nothing more is opened, STOPPING=1 is said
// if the notify socket is open, and started is false with a nil error (the daemon exits 0).
// started is true when every step ran and Run should follow.
func (d *Daemon) Start(ctx context.Context) (started bool, err error) {
	if err := platformSupported(); err != nil {
		return false, err
	}
	for _, s := range d.steps() {
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

// onClose queues fn for Close, which runs the queue in reverse order.
func (d *Daemon) onClose(fn func() error) { d.closers = append(d.closers, fn) }

// Close closes everything the steps opened, in reverse order. It is safe after a failed or
// interrupted Start.
func (d *Daemon) Close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		if err := d.closers[i](); err != nil {
			d.log.Warn("close", "err", err)
		}
	}
	d.closers = nil
}

// Bus is the daemon's bus (nil before the servers step).
func (d *Daemon) Bus() *bus.Bus { return d.bus }

// Store is the daemon's store (nil before the store step).
func (d *Daemon) Store() *store.Store { return d.store }

// AgentServer and RegisterServer are the servers of agent.sock and register.sock (nil when the
// socket is not served).
func (d *Daemon) AgentServer() *agentsock.Server       { return d.agent }
func (d *Daemon) RegisterServer() *registersock.Server { return d.register }

// Run is steps 6 and 7: it serves the group until ctx is done or a server fails. Once every
// server runs it logs the serving line, sends READY=1 and starts the STATUS=/watchdog ticker;
// when the stop begins it says STOPPING=1, before the drain. Its error is the daemon's exit.
func (d *Daemon) Run(ctx context.Context) error {
	if d.group.Len() == 0 {
		return errors.New("serve: no socket to serve (systemd passed none of http, agent, register)")
	}
	// A session dir that appears, or the relaunch helper ending, ends the run as a signal does.
	ctx, stopByRelaunch := context.WithCancel(ctx)
	defer stopByRelaunch()
	go d.watchRelaunch(ctx, stopByRelaunch)
	// The status ticker stops with the group, whichever way it stops.
	tickCtx, stopTicks := context.WithCancel(ctx)
	defer stopTicks()
	status := func() { d.notify.Status(d.status()) }
	readyFailed := false // then the notify socket is unusable: no STOPPING=1 either
	d.group.Started = func() error {
		// Every listener was listening before this point (bound or inherited), so each
		// socket accepts now: connections queue in the kernel backlog until Serve runs.
		d.log.Info("serving", d.serving...)
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
	d.group.Stopping = func() {
		stopTicks()
		d.stopRun()
		switch {
		case d.relaunchDir != "":
			d.log.Info("stopping", "reason", "relaunch")
		case ctx.Err() != nil:
			d.log.Info("stopping", "reason", "signal")
		}
		if !readyFailed {
			d.notify.Stopping()
		}
	}
	if err := d.group.Run(ctx); err != nil {
		d.log.Error("stopped with an error", "err", err)
		return err
	}
	d.log.Info("stopped")
	return nil
}

// tick keeps STATUS= current and pets the watchdog (at half its interval) until ctx ends.
func (d *Daemon) tick(ctx context.Context, status func()) {
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
