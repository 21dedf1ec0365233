// Package bench measures xmsg end to end, the way `nats bench` and `redis-benchmark` do for
// their servers: a daemon in its own process (started on temporary paths, or one already
// running), real child processes as Claude sessions and services, clients on the real
// sockets, and with every figure the same run's baselines (one fsync, one bbolt commit) and
// the ratio to them, since absolute numbers depend on the machine and its load. A latency
// path's baselines are taken between slices of its own sends: on a shared machine the disk's
// latency drifts by a third within one run, and a ratio to a baseline taken a minute earlier
// measured that drift as much as the path.
package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	bolt "go.etcd.io/bbolt"

	"github.com/xmsg/xmsg/internal/peercred"
)

// Options of one benchmark.
type Options struct {
	Self string   // executable started as daemon and children (xmsg itself)
	Env  []string // their environment

	// A running daemon: its http.sock; "" starts one on temporary paths. Then AgentSock and
	// RegisterSock default to the sibling sockets, SessionsDir must be the daemon's session
	// directory for the Claude paths, and Service a service whose trusted executable is Self
	// for the service paths; the growth paths are not run (they would fill its directories).
	Sock, AgentSock, RegisterSock string
	SessionsDir                   string
	Service                       string

	Count    int // sends per latency path
	Clients  int // concurrent clients
	Services int // registered services (and consumers)
	Stale    int // stale session files for the growth path
	Runs     int
	Size     int // message text bytes
	Leaves   int // the leaf path's leaf daemons (RunLeaf; 0 or 1: one)
	// LeafState is a directory for the leaves' stores (RunLeaf): "" beside the hub's, in the
	// same temporary directory; another filesystem gives them a disk of their own, as leaves
	// on other machines have, so that their commits do not slow the hub's.
	LeafState string
	// Only, when set, runs only the paths whose name holds it (a growth figure only when both
	// its paths run): a profile of the daemons then covers those paths alone.
	Only string

	Progress io.Writer // a progress line ("" = none)

	// Interrupt, when it yields, stops the daemon and the children and removes the temporary
	// directory before RunBench returns ErrInterrupted: a bench stopped by Ctrl-C or SIGTERM
	// leaves no daemon and no files behind.
	Interrupt <-chan os.Signal
}

// ErrInterrupted is RunBench's error after Options.Interrupt yielded.
var ErrInterrupted = errors.New("bench: interrupted")

// Figure is one measured path.
type Figure struct {
	Path   string   `json:"path"`
	Kind   PathKind `json:"kind,omitempty"`
	N      int      `json:"n"`
	P50us  float64  `json:"p50_us,omitempty"`
	P99us  float64  `json:"p99_us,omitempty"`
	PerSec float64  `json:"per_sec"`
	CPUus  float64  `json:"daemon_cpu_us_per_op,omitempty"` // daemon CPU per op (own daemon only; the leaf path's: the hub's)
	// LeafCPUus is, on the leaf paths through leaves, the CPU of every leaf daemon together
	// per op.
	LeafCPUus float64 `json:"leaf_cpu_us_per_op,omitempty"`
	// MachineCPUus is the whole machine's busy CPU per op (daemon, clients, sessions,
	// services, and anything else running), from /proc/stat: with the CPU count it bounds
	// the throughput this machine can give the path at all.
	MachineCPUus float64 `json:"machine_cpu_us_per_op,omitempty"`
	XCommit      float64 `json:"x_commit,omitempty"` // p50 / commit p50 (CommitP50us when set, else the run's)
	XFsync       float64 `json:"x_fsync,omitempty"`  // p50 / fsync p50 (likewise)
	// CommitP50us and FsyncP50us are the baselines measured between a latency path's own
	// sends, so that its ratios compare it with the disk as it was while it ran: the disk's
	// latency drifts by a third within a run on a shared machine.
	CommitP50us float64 `json:"commit_p50_us,omitempty"`
	FsyncP50us  float64 `json:"fsync_p50_us,omitempty"`
	Refused     int     `json:"refused,omitempty"` // 503s (full queues), retried
	// Duplicates counts messages a consumer got again after it had them (the leaf paths):
	// with no crash in the run, any is a fault.
	Duplicates int    `json:"duplicates,omitempty"`
	Note       string `json:"note,omitempty"`
}

// Run is one pass over every path.
type Run struct {
	FsyncP50us  float64 `json:"fsync_p50_us"`
	CommitP50us float64 `json:"commit_p50_us"`
	// RTTP50us is a round trip to another process over a Unix socket: what every exchange
	// pays at least once, and what a loaded machine makes slow (it waits for a CPU).
	RTTP50us float64  `json:"process_rtt_p50_us"`
	Figures  []Figure `json:"figures"`
	Growth   []Growth `json:"growth,omitempty"`
}

// Growth compares a path's p50 with more state against less.
type Growth struct {
	Name  string   `json:"name"`
	Kind  PathKind `json:"kind,omitempty"` // the larger path's
	Small float64  `json:"small_p50_us"`
	Large float64  `json:"large_p50_us"`
	// Ratio is Large/Small with Large's commit exchanged for Small's: (Large - its commit p50
	// + Small's commit p50) / Small, each commit p50 the one taken between that path's own
	// sends. A send's latency is its commit plus the rest; the two paths run a minute apart,
	// the disk's drift over that minute is not the cost of the extra state, and this takes
	// exactly that drift out. RawRatio is Large/Small as measured.
	Ratio    float64 `json:"ratio"`
	RawRatio float64 `json:"raw_ratio"`
}

// growth compares large against small, the disk's drift between them taken out (Ratio).
func growth(name string, small, large Figure) Growth {
	g := Growth{Name: name, Kind: large.Kind, Small: small.P50us, Large: large.P50us, RawRatio: large.P50us / small.P50us}
	g.Ratio = g.RawRatio
	if small.CommitP50us > 0 && large.CommitP50us > 0 {
		// A send contains a commit, so its p50 exceeds the commits' unless their sample was
		// noise (a short run on a busy machine): a correction that takes out more than the
		// path's own latency measures nothing, and the ratio as measured stands.
		if r := (large.P50us - large.CommitP50us + small.CommitP50us) / small.P50us; r > 0 {
			g.Ratio = r
		}
	}
	return g
}

// Result is every run, plus how they were made.
type Result struct {
	DaemonPID int    `json:"daemon_pid,omitempty"`
	CPUs      int    `json:"cpus"`   // this machine's, shared by the daemon and every client
	Daemon    string `json:"daemon"` // "own process on temporary paths" or the socket
	Size      int    `json:"size"`
	Runs      []Run  `json:"runs"`
	// Goals are the performance goals these runs speak to, each with its figure over them.
	Goals []GoalFigure `json:"goals,omitempty"`
}

type env struct {
	o        Options
	dir      string
	http     string
	agent    string
	register string
	sessions string
	daemon   *exec.Cmd
	pid      int
	children []*child
	target   *child // the Claude session that 1-client and agent sends go to
	sender   *child // the Claude session that sends over agent.sock
	targets  []*child
	svcs     []*child
	batch    *child // the consumer that takes batches (batchSvc)
	echo     string // socket of the echo child (the process round-trip baseline)
	prog     *progress
	text     string
	base     *baseline // this run's, open while it runs

	// stopOnce makes stop safe to call from the interrupt and from RunBench's defer; mu
	// guards daemon and children, which the interrupt may stop while they are being started.
	stopOnce    sync.Once
	mu          sync.Mutex
	stopped     bool
	interrupted atomic.Bool
}

type child struct {
	id    string
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	count int64 // messages a service has been told to expect so far
}

// Run runs the benchmark.
func RunBench(o Options) (*Result, error) {
	if o.Count <= 0 || o.Clients <= 0 || o.Runs <= 0 || o.Size <= 0 {
		return nil, errors.New("bench: counts must be positive")
	}
	if o.Services <= 0 {
		o.Services = 1
	}
	dir, err := os.MkdirTemp("", "xmsg-bench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	e := &env{o: o, dir: dir, prog: newProgress(o.Progress), text: strings.Repeat("x", o.Size)}
	defer e.prog.done()
	defer e.stop()
	if o.Interrupt != nil {
		// The paths block in socket and pipe reads: stopping the processes under them is what
		// makes them return (with errors, which the interrupt then explains).
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-o.Interrupt:
				e.interrupted.Store(true)
				e.stop()
			case <-done:
			}
		}()
	}
	res, err := e.runAll()
	if e.interrupted.Load() {
		return nil, ErrInterrupted
	}
	return res, err
}

func (e *env) runAll() (*Result, error) {
	o := e.o
	res := &Result{Size: o.Size, CPUs: runtime.NumCPU()}
	if o.Sock == "" {
		if err := e.startDaemon(); err != nil {
			return nil, err
		}
		res.DaemonPID, res.Daemon = e.pid, "own process on temporary paths"
	} else {
		e.http = o.Sock
		e.agent, e.register, e.sessions = o.AgentSock, o.RegisterSock, o.SessionsDir
		if e.agent == "" {
			e.agent = filepath.Join(filepath.Dir(o.Sock), "agent.sock")
		}
		if e.register == "" {
			e.register = filepath.Join(filepath.Dir(o.Sock), "register.sock")
		}
		res.Daemon = o.Sock
	}
	if err := e.startChildren(); err != nil {
		return nil, err
	}
	for i := range o.Runs {
		e.prog.run = fmt.Sprintf("run %d/%d", i+1, o.Runs)
		r, err := e.run()
		if err != nil {
			return nil, err
		}
		res.Runs = append(res.Runs, *r)
	}
	res.Goals = goals(res.Runs)
	return res, nil
}

func (e *env) own() bool { return e.o.Sock == "" }

// batchSvc is the service whose consumer takes its messages in batches (own daemon only).
const batchSvc = "benchbatch"

func (e *env) svcName(i int) string {
	if !e.own() {
		return e.o.Service
	}
	return fmt.Sprintf("bench%d", i)
}

func (e *env) startDaemon() error {
	rt := filepath.Join(e.dir, "rt")
	e.sessions = filepath.Join(e.dir, "sessions")
	for _, d := range []string{rt, e.sessions} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	e.http, e.agent, e.register = filepath.Join(rt, "http.sock"), filepath.Join(rt, "agent.sock"), filepath.Join(rt, "register.sock")
	self, err := peercred.Canonical(e.o.Self)
	if err != nil {
		return err
	}
	svcs := []string{batchSvc + "=" + self}
	for i := range e.o.Services {
		svcs = append(svcs, e.svcName(i)+"="+self)
	}
	args := []string{"serve", "--db-path", filepath.Join(e.dir, "state", "xmsg.db"), "--sessions-dir", e.sessions,
		"--http-sock", e.http, "--agent-sock", e.agent, "--register-sock", e.register, "--host-label", "bench",
		"--svc-exe", strings.Join(svcs, ","),
		// The bench's clients are goroutines of one process: its share of each socket must
		// hold them all (the defaults are sized for many processes with a few each).
		"--http-max-conns", strconv.Itoa(2*e.o.Clients + 64), "--http-max-per-pid", strconv.Itoa(2*e.o.Clients + 8),
		"--agent-max-conns", "128", "--register-max-conns", strconv.Itoa(e.o.Services + 17)}
	log, err := os.Create(filepath.Join(e.dir, "daemon.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	daemon := exec.Command(e.o.Self, args...)
	daemon.Env = append(append([]string{}, e.o.Env...), "XDG_RUNTIME_DIR="+rt)
	daemon.Stderr = log
	if err := e.track(daemon, func() { e.daemon = daemon }); err != nil {
		return fmt.Errorf("bench: start daemon: %w", err)
	}
	e.pid = daemon.Process.Pid
	for range 1000 {
		if c, err := dialHTTP(e.http); err == nil {
			st, _, err := c.do("GET", "/healthz", nil)
			c.close()
			if err == nil && st == 200 {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	raw, _ := os.ReadFile(filepath.Join(e.dir, "daemon.log"))
	return fmt.Errorf("bench: daemon did not start:\n%s", raw)
}

// track starts cmd and records it (with add) for stop, unless stop has already run: then the
// process is killed at once, so an interrupt during start-up leaves nothing behind.
func (e *env) track(cmd *exec.Cmd, add func()) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return ErrInterrupted
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	add()
	return nil
}

// stop ends the children (their stdin closes), then the daemon (SIGINT, a clean stop), each
// killed if it does not end in time. It runs once, from RunBench's defer or the interrupt.
func (e *env) stop() {
	e.stopOnce.Do(func() {
		e.mu.Lock()
		e.stopped = true
		e.mu.Unlock()
		e.stopAll()
	})
}

func (e *env) stopAll() {
	for _, c := range e.children {
		c.in.Close()
	}
	for _, c := range e.children {
		done := make(chan struct{})
		go func() { c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			c.cmd.Process.Kill()
			<-done
		}
	}
	if e.daemon != nil {
		e.daemon.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { e.daemon.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			e.daemon.Process.Kill()
			<-done
		}
	}
}

func (e *env) spawn(args ...string) (*child, error) {
	c := &child{cmd: exec.Command(e.o.Self, append([]string{RoleArg}, args...)...)}
	c.cmd.Env = e.o.Env
	c.cmd.Stderr = os.Stderr
	var err error
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.out = bufio.NewReader(out)
	if err := e.track(c.cmd, func() { e.children = append(e.children, c) }); err != nil {
		return nil, err
	}
	if line, err := c.line(); err != nil || line != "ready" {
		return nil, fmt.Errorf("bench: child %v did not start: %q %v", args, line, err)
	}
	return c, nil
}

func (c *child) line() (string, error) {
	s, err := c.out.ReadString('\n')
	return strings.TrimSpace(s), err
}

func (c *child) cmdLine(format string, a ...any) (string, error) {
	if _, err := fmt.Fprintf(c.in, format+"\n", a...); err != nil {
		return "", err
	}
	return c.line()
}

// rtt measures n round trips of a size-byte line to the echo child.
func (e *env) rtt(n int) ([]float64, error) {
	c, err := net.Dial("unix", e.echo)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	r := bufio.NewReader(c)
	line := append([]byte(e.text), '\n')
	var out []float64
	for range max(n, 1) {
		t0 := time.Now()
		if _, err := c.Write(line); err != nil {
			return nil, err
		}
		if _, err := r.ReadBytes('\n'); err != nil {
			return nil, err
		}
		out = append(out, us(time.Since(t0)))
	}
	return out, nil
}

// startChildren starts the Claude sessions (targets for the concurrent clients, one of them
// the 1-client target, and an agent.sock sender) and the first service consumer.
func (e *env) startChildren() error {
	e.echo = filepath.Join(e.dir, "echo.sock")
	if _, err := e.spawn("echo", e.echo); err != nil {
		return err
	}
	if e.sessions != "" {
		inboxes := filepath.Join(e.dir, "inbox")
		if err := os.Mkdir(inboxes, 0o700); err != nil {
			return err
		}
		n := min(8, e.o.Clients) + 1
		for i := range n {
			id := uuid.NewString()
			c, err := e.spawn("claude", e.sessions, id, filepath.Join(inboxes, strconv.Itoa(i)+".sock"))
			if err != nil {
				return err
			}
			c.id = id
			if i == n-1 {
				e.sender = c
			} else {
				e.targets = append(e.targets, c)
			}
		}
		e.target = e.targets[0]
	}
	if e.own() || e.o.Service != "" {
		c, err := e.spawn("svc", e.svcName(0), e.register)
		if err != nil {
			return err
		}
		c.id = "svc:" + e.svcName(0)
		e.svcs = append(e.svcs, c)
	}
	if e.own() {
		c, err := e.spawn("svc", batchSvc, e.register, "batch")
		if err != nil {
			return err
		}
		c.id = "svc:" + batchSvc
		e.batch = c
	}
	return nil
}

// run is one pass: baselines, then every path.
func (e *env) run() (*Run, error) {
	r := &Run{}
	base, err := e.openBaseline()
	if err != nil {
		return nil, err
	}
	defer base.close()
	e.base = base
	fsync1, commit1, err := e.baselines(e.o.Count / 2)
	if err != nil {
		return nil, err
	}
	rtt1, err := e.rtt(e.o.Count / 2)
	if err != nil {
		return nil, err
	}
	add := func(k PathKind, f Figure, err error) error {
		if err == nil {
			f.Kind = k
			r.Figures = append(r.Figures, f)
		}
		return err
	}
	// want: the path named name is run (Options.Only); a growth figure needs both of its paths.
	want := func(name string) bool { return e.o.Only == "" || strings.Contains(name, e.o.Only) }
	if e.target != nil {
		stale := min(10, e.o.Stale)
		if e.own() {
			if err := e.writeStale(0, stale); err != nil {
				return nil, err
			}
		}
		var small Figure
		if name := "1 client -> claude (http)"; want(name) {
			if small, err = e.latency(name, "/v1/sessions/"+e.target.id+"/messages"); err != nil {
				return nil, err
			}
			small.Kind = ClaudeOne
			r.Figures = append(r.Figures, small)
		}
		if want("1 client -> claude (agent.sock)") {
			if f, err := e.agentLatency(); add(AgentOne, f, err) != nil {
				return nil, err
			}
		}
		if want(fmt.Sprintf("%d clients -> claude (http)", e.o.Clients)) {
			if f, err := e.concurrentClaude(); add(ClaudeMany, f, err) != nil {
				return nil, err
			}
		}
		if name := fmt.Sprintf("1 client -> claude, %d stale files", e.o.Stale); e.own() && e.o.Stale > stale && want(name) {
			if err := e.writeStale(stale, e.o.Stale); err != nil {
				return nil, err
			}
			large, err := e.latency(name, "/v1/sessions/"+e.target.id+"/messages")
			if err != nil {
				return nil, err
			}
			large.Kind = ClaudeStale
			r.Figures = append(r.Figures, large)
			if small.P50us > 0 {
				r.Growth = append(r.Growth, growth(fmt.Sprintf("%d vs %d stale session files", e.o.Stale, stale), small, large))
			}
			if err := e.removeStale(stale, e.o.Stale); err != nil {
				return nil, err
			}
		}
	}
	if len(e.svcs) > 0 {
		var small Figure
		if name := "1 client -> svc (http), 1 registered"; want(name) {
			if small, err = e.svcLatency(name); err != nil {
				return nil, err
			}
			small.Kind = SvcOne
			r.Figures = append(r.Figures, small)
		}
		for i, n := range []int{min(8, e.o.Clients), e.o.Clients} {
			if want(fmt.Sprintf("1 consumer drains, %d senders", n)) {
				k := DrainFew
				if i > 0 {
					k = DrainAll
				}
				if f, err := e.drain(e.svcs[0], fmt.Sprintf("1 consumer drains, %d senders", n), n); add(k, f, err) != nil {
					return nil, err
				}
			}
			// The same, its consumer taking batches: with few senders the queue is seldom
			// deeper than a message, with all of them it is full (docs/performance.md §3).
			if name := fmt.Sprintf("1 consumer drains in batches, %d senders", n); e.batch != nil && want(name) {
				k := DrainBatch
				if i > 0 {
					k = DrainBatchAll
				}
				if f, err := e.drain(e.batch, name, n); add(k, f, err) != nil {
					return nil, err
				}
			}
			if n == e.o.Clients {
				break
			}
		}
		svcN := fmt.Sprintf("1 client -> svc (http), %d registered", e.o.Services)
		many := fmt.Sprintf("%d clients -> %d services, %d consumers", e.o.Clients, e.o.Services, e.o.Services)
		if e.own() && e.o.Services > 1 && (want(svcN) || want(many)) {
			for i := len(e.svcs); i < e.o.Services; i++ {
				c, err := e.spawn("svc", e.svcName(i), e.register)
				if err != nil {
					return nil, err
				}
				c.id = "svc:" + e.svcName(i)
				e.svcs = append(e.svcs, c)
			}
			if want(svcN) {
				large, err := e.svcLatency(svcN)
				if err != nil {
					return nil, err
				}
				large.Kind = SvcRegistered
				r.Figures = append(r.Figures, large)
				if small.P50us > 0 {
					r.Growth = append(r.Growth, growth(fmt.Sprintf("%d vs 1 registered services", e.o.Services), small, large))
				}
			}
			if want(many) {
				if f, err := e.manyServices(); add(SvcMany, f, err) != nil {
					return nil, err
				}
			}
		}
	}
	fsync2, commit2, err := e.baselines(e.o.Count - e.o.Count/2)
	if err != nil {
		return nil, err
	}
	rtt2, err := e.rtt(e.o.Count - e.o.Count/2)
	if err != nil {
		return nil, err
	}
	r.RTTP50us = percentile(append(rtt1, rtt2...), 50)
	r.FsyncP50us = percentile(append(fsync1, fsync2...), 50)
	r.CommitP50us = percentile(append(commit1, commit2...), 50)
	for i := range r.Figures {
		f := &r.Figures[i]
		if f.P50us == 0 {
			continue
		}
		commit, fsync := r.CommitP50us, r.FsyncP50us
		if f.CommitP50us > 0 {
			commit, fsync = f.CommitP50us, f.FsyncP50us
		}
		f.XCommit, f.XFsync = f.P50us/commit, f.P50us/fsync
	}
	return r, nil
}

// baseline is the run's reference, measured in this process on the daemon's filesystem:
// fsyncs of a 200-byte append, and bbolt commits of one put.
type baseline struct {
	e    *env
	f    *os.File
	db   *bolt.DB
	buf  []byte
	puts int
}

func (e *env) openBaseline() (*baseline, error) {
	f, err := os.Create(filepath.Join(e.dir, "fsync.bin"))
	if err != nil {
		return nil, err
	}
	db, err := bolt.Open(filepath.Join(e.dir, "baseline.db"), 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		f.Close()
		return nil, err
	}
	return &baseline{e: e, f: f, db: db, buf: make([]byte, e.o.Size)}, nil
}

func (b *baseline) close() {
	b.f.Close()
	b.db.Close()
}

// measure takes n fsyncs and n commits.
func (b *baseline) measure(n int) (fsync, commit []float64, err error) {
	for range max(n, 1) {
		if b.e.interrupted.Load() { // the baselines use no process an interrupt could stop
			return nil, nil, ErrInterrupted
		}
		t0 := time.Now()
		if _, err := b.f.Write(b.buf); err != nil {
			return nil, nil, err
		}
		if err := b.f.Sync(); err != nil {
			return nil, nil, err
		}
		fsync = append(fsync, us(time.Since(t0)))
		b.e.prog.tick(1)
	}
	for range max(n, 1) {
		if b.e.interrupted.Load() {
			return nil, nil, ErrInterrupted
		}
		b.puts++
		t0 := time.Now()
		err := b.db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte("b"))
			if err != nil {
				return err
			}
			return bk.Put([]byte(uuid.NewString()+strconv.Itoa(b.puts)), b.buf)
		})
		if err != nil {
			return nil, nil, err
		}
		commit = append(commit, us(time.Since(t0)))
		b.e.prog.tick(1)
	}
	return fsync, commit, nil
}

// baselines is the run's own pass of n fsyncs and n commits (at its start and its end).
func (e *env) baselines(n int) (fsync, commit []float64, err error) {
	e.prog.set("baselines", max(n, 1)*2)
	return e.base.measure(n)
}

// interleaved is a latency path's measurement: its sends, in slices, with the baseline taken
// between them (a quarter as many fsyncs and commits as sends). The path's wall time and
// daemon CPU count the slices only.
type interleaved struct {
	lat, fsync, commit []float64
	wall               time.Duration
	cpu                float64 // µs, or -1 when the daemon is not ours
	machine            float64 // µs of the whole machine, or -1
	n                  int
}

// slices is how many pieces a latency path is cut into for its baselines.
const slices = 10

// interleave runs do over n sends in slices, measuring the baseline after each.
func (e *env) interleave(n int, do func(n int) ([]float64, error)) (interleaved, error) {
	var m interleaved
	for i := range slices {
		k := n / slices
		if i < n%slices {
			k++
		}
		if k == 0 {
			continue
		}
		cpu0, mach0 := e.cpu(), machineCPU()
		t0 := time.Now()
		lat, err := do(k)
		m.wall += time.Since(t0)
		if mach1 := machineCPU(); mach0 < 0 || mach1 < 0 || m.machine < 0 {
			m.machine = -1
		} else {
			m.machine += mach1 - mach0
		}
		if err != nil {
			return m, err
		}
		if cpu1 := e.cpu(); cpu0 < 0 || cpu1 < 0 || m.cpu < 0 {
			m.cpu = -1
		} else {
			m.cpu += cpu1 - cpu0
		}
		m.lat = append(m.lat, lat...)
		m.n += k
		fs, cs, err := e.base.measure(max(k/4, 1))
		if err != nil {
			return m, err
		}
		m.fsync, m.commit = append(m.fsync, fs...), append(m.commit, cs...)
	}
	return m, nil
}

// latencyFigure is a latency path's figure, with the baselines taken between its sends.
func (e *env) latencyFigure(name string, m interleaved) Figure {
	f := Figure{Path: name, N: m.n, PerSec: float64(m.n) / m.wall.Seconds()}
	if len(m.lat) > 0 {
		f.P50us, f.P99us = percentile(m.lat, 50), percentile(m.lat, 99)
	}
	if m.cpu >= 0 && m.n > 0 {
		f.CPUus = m.cpu / float64(m.n)
	}
	if m.machine >= 0 && m.n > 0 {
		f.MachineCPUus = m.machine / float64(m.n)
	}
	f.CommitP50us, f.FsyncP50us = percentile(m.commit, 50), percentile(m.fsync, 50)
	return f
}

func (e *env) body() []byte {
	return []byte(`{"from":"bench","text":"` + e.text + `"}`)
}

// latency: one client, sequential sends over one keep-alive HTTP connection.
func (e *env) latency(name, path string) (Figure, error) {
	c, err := dialHTTP(e.http)
	if err != nil {
		return Figure{}, err
	}
	defer c.close()
	body := e.body()
	warm := max(e.o.Count/10, 1)
	e.prog.set(name, e.o.Count+warm+2*max(e.o.Count/4, slices))
	refused := 0
	// send is one accepted send and its latency; a 503 (a service's full queue: its consumer
	// fell behind for a moment) is retried after a pause, as a real client would, and counted
	// rather than failing the run. The latency is that of the accepted attempt.
	send := func() (float64, error) {
		for backoff := time.Millisecond; ; backoff = min(2*backoff, 32*time.Millisecond) {
			t := time.Now()
			st, raw, err := c.do("POST", path, body)
			switch {
			case err == nil && st == 202:
				return us(time.Since(t)), nil
			case err == nil && st == 503 && refused < 10*e.o.Count:
				refused++
				time.Sleep(backoff)
			default:
				return 0, fmt.Errorf("bench: %s: %d %s %v", name, st, raw, err)
			}
		}
	}
	for range warm {
		if _, err := send(); err != nil {
			return Figure{}, err
		}
		e.prog.tick(1)
	}
	m, err := e.interleave(e.o.Count, func(n int) ([]float64, error) {
		lat := make([]float64, 0, n)
		for range n {
			d, err := send()
			if err != nil {
				return nil, err
			}
			lat = append(lat, d)
			e.prog.tick(1)
		}
		return lat, nil
	})
	if err != nil {
		return Figure{}, err
	}
	f := e.latencyFigure(name, m)
	f.Refused = refused
	return f, nil
}

// svcLatency is latency to the first service while its consumer drains.
func (e *env) svcLatency(name string) (Figure, error) {
	s := e.svcs[0]
	f, err := e.latency(name, "/v1/sessions/"+s.id+"/messages")
	if err != nil {
		return f, err
	}
	s.count += int64(e.o.Count + max(e.o.Count/10, 1))
	return f, e.await(s)
}

func (e *env) await(s *child) error {
	if line, err := s.cmdLine("wait %d", s.count); err != nil || line != "reached" {
		return fmt.Errorf("bench: consumer %s: %q %v", s.id, line, err)
	}
	return nil
}

// agentLatency: the sender session sends to the target session over agent.sock, timed in
// the sender (the attested process).
func (e *env) agentLatency() (Figure, error) {
	name := "1 client -> claude (agent.sock)"
	e.prog.set(name, 0)
	warm := max(e.o.Count/10, 1)
	if _, err := e.sender.cmdLine("agent %s %s %d %d", e.agent, e.target.id, warm, e.o.Size); err != nil {
		return Figure{}, err
	}
	m, err := e.interleave(e.o.Count, func(n int) ([]float64, error) {
		line, err := e.sender.cmdLine("agent %s %s %d %d", e.agent, e.target.id, n, e.o.Size)
		if err != nil {
			return nil, err
		}
		var ns []int64
		if err := json.Unmarshal([]byte(line), &ns); err != nil || len(ns) != n {
			return nil, fmt.Errorf("bench: agent sender: %s", line)
		}
		lat := make([]float64, len(ns))
		for i, v := range ns {
			lat[i] = float64(v) / 1e3
		}
		return lat, nil
	})
	if err != nil {
		return Figure{}, err
	}
	return e.latencyFigure(name, m), nil
}

// concurrent runs total sends from clients connections, each client sending to
// path(client); a 503 (full queue) is retried after a pause and counted.
func (e *env) concurrent(name string, total int, path func(i int) string) (Figure, error) {
	return e.concurrentN(name, e.o.Clients, total, path)
}

// concurrentN is concurrent with clients connections.
func (e *env) concurrentN(name string, clients, total int, path func(i int) string) (Figure, error) {
	e.prog.set(name, total)
	per := max(total/clients, 1)
	var refused atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	body := e.body()
	conns := make([]*httpConn, clients)
	for i := range conns {
		c, err := dialHTTP(e.http)
		if err != nil {
			return Figure{}, err
		}
		defer c.close()
		conns[i] = c
	}
	cpu0, mach0 := e.cpu(), machineCPU()
	t0 := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := path(i)
			backoff := time.Millisecond
			for n := 0; n < per; {
				st, raw, err := c.do("POST", p, body)
				switch {
				case err == nil && st == 202:
					n++
					backoff = time.Millisecond
					e.prog.tick(1)
				case err == nil && st == 503:
					// A full queue: back off as a real client would (doubling, to 32 ms).
					refused.Add(1)
					time.Sleep(backoff)
					backoff = min(2*backoff, 32*time.Millisecond)
				default:
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("bench: %s: %d %s %v", name, st, raw, err)
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return Figure{}, firstErr
	}
	f := e.figure(name, nil, time.Since(t0), cpu0, mach0, per*clients)
	f.Refused = int(refused.Load())
	return f, nil
}

func (e *env) concurrentClaude() (Figure, error) {
	return e.concurrent(fmt.Sprintf("%d clients -> claude (http)", e.o.Clients), e.o.Count*4, func(i int) string {
		return "/v1/sessions/" + e.targets[i%len(e.targets)].id + "/messages"
	})
}

// drain: senders keep service s's queue supplied while its one consumer drains it;
// the rate is messages received by the consumer per second, until it has them all. With few
// senders the queue rarely fills; with all clients it is full most of the time and most
// attempts are refused (a 503 storm), which the consumer has to drain through.
func (e *env) drain(s *child, name string, senders int) (Figure, error) {
	total := e.o.Count * 4
	t0 := time.Now()
	f, err := e.concurrentN(name, senders, total, func(int) string { return "/v1/sessions/" + s.id + "/messages" })
	if err != nil {
		return f, err
	}
	s.count += int64(f.N)
	if err := e.await(s); err != nil {
		return f, err
	}
	f.PerSec = float64(f.N) / time.Since(t0).Seconds()
	f.Note = "received by the consumer per second"
	return f, nil
}

// manyServices: client i sends to service i mod Services, each drained by its own consumer.
func (e *env) manyServices() (Figure, error) {
	name := fmt.Sprintf("%d clients -> %d services, %d consumers", e.o.Clients, len(e.svcs), len(e.svcs))
	t0 := time.Now()
	f, err := e.concurrent(name, e.o.Count*4, func(i int) string { return "/v1/sessions/" + e.svcs[i%len(e.svcs)].id + "/messages" })
	if err != nil {
		return f, err
	}
	per := f.N / e.o.Clients
	for i := range e.o.Clients {
		e.svcs[i%len(e.svcs)].count += int64(per)
	}
	for _, s := range e.svcs {
		if err := e.await(s); err != nil {
			return f, err
		}
	}
	f.PerSec = float64(f.N) / time.Since(t0).Seconds()
	f.Note = "until every consumer has its messages"
	return f, nil
}

func (e *env) figure(name string, lat []float64, wall time.Duration, cpu0, mach0 float64, n int) Figure {
	f := Figure{Path: name, N: n, PerSec: float64(n) / wall.Seconds()}
	if len(lat) > 0 {
		f.P50us, f.P99us = percentile(lat, 50), percentile(lat, 99)
	}
	if cpu0 >= 0 {
		if cpu1 := e.cpu(); cpu1 >= 0 {
			f.CPUus = (cpu1 - cpu0) / float64(n)
		}
	}
	if mach0 >= 0 {
		if mach1 := machineCPU(); mach1 >= 0 {
			f.MachineCPUus = (mach1 - mach0) / float64(n)
		}
	}
	return f
}

// machineCPU is the time all CPUs spent busy since boot, in µs (/proc/stat: user, nice,
// system, irq, softirq; not idle, iowait or steal), or -1 where there is no /proc/stat.
func machineCPU() float64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return -1
	}
	var ticks float64
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return -1
		}
		ticks += v
	}
	return ticks * 1e6 / clockTicks
}

// clockTicks is USER_HZ, /proc/stat's unit: 100 on every Linux architecture Go supports.
const clockTicks = 100

// cpu is the daemon's user+system CPU time in µs, or -1 when it is not ours.
func (e *env) cpu() float64 {
	if e.pid == 0 {
		return -1
	}
	d, err := peercred.Proc{}.CPUTime(e.pid)
	if err != nil {
		return -1
	}
	return us(d)
}

// writeStale writes session files [from, to) of processes that are gone (pids above any
// pid_max), as Claude leaves them behind after a crash.
func (e *env) writeStale(from, to int) error {
	e.prog.set("stale session files", to-from)
	for i := from; i < to; i++ {
		raw, _ := json.Marshal(map[string]any{"pid": 5000000 + i, "sessionId": uuid.NewString(), "name": fmt.Sprintf("stale-%d", i),
			"cwd": "/", "status": "idle", "procStart": "1", "messagingSocketPath": "/nonexistent"})
		if err := os.WriteFile(filepath.Join(e.sessions, fmt.Sprintf("stale-%05d.json", i)), raw, 0o600); err != nil {
			return err
		}
		e.prog.tick(1)
	}
	return nil
}

func (e *env) removeStale(from, to int) error {
	for i := from; i < to; i++ {
		if err := os.Remove(filepath.Join(e.sessions, fmt.Sprintf("stale-%05d.json", i))); err != nil {
			return err
		}
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}
