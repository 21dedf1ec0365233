// Package bus is xmsg's message routing: who is addressable, how a ref resolves, delivery per
// harness, replies and their pushes, idempotency, queues and long-poll wakeups. It performs no
// socket serving of its own; the servers (httpapi, agentsock, registersock) translate their
// wire formats into calls here, so every socket applies the same rules.
package bus

import (
	"encoding/json"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/xmsg/xmsg/internal/agy"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/codex"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/harness/svc"
	"github.com/xmsg/xmsg/internal/harness/uid"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/lockwatch"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/ratelog"
	"github.com/xmsg/xmsg/internal/store"
	"github.com/xmsg/xmsg/internal/wake"
)

// Config is what the bus needs; it is not changed after New.
type Config struct {
	Host     string
	MaxBody  int
	ReplyTTL time.Duration
	IdemTTL  time.Duration
	SvcExe   map[string]string // service name → trusted executable path
	Store    *store.Store
	Claude   *claude.Scanner
	Proc     peercred.Proc
	// Exe resolves a pid's executable for svc attestation; nil means Proc.Exe. A sandboxed
	// daemon passes the exehelper's, because Landlock denies it /proc/<pid>/exe.
	Exe          func(pid int) (string, error)
	Log          *slog.Logger
	InboxTimeout time.Duration
	MaxWaiters   int // concurrent reply long-polls (HTTP); 0 means limits.HTTPMaxWaiters
	// Codex attests Codex sessions; nil when none is configured.
	Codex *codex.Attester
	// Agy attests Antigravity sessions (nil: none); AgySend runs agentapi for them.
	Agy     *agy.Attester
	AgySend func(c agy.Credentials, title, envelope string) (agy.Outcome, error)
	// AckDelay holds acknowledged deletes this long before committing them (0 = ride the next
	// commit, or make one after 5 ms). Only tests set it, to stand for a crash right after an ack.
	AckDelay time.Duration
	// AckRide is how long acknowledged deletes wait for a commit made anyway before one is made
	// for them (0: 5 ms). A leaf waits longer: its commits come with each batch it pulls, and
	// a crash before the delete's commit only delivers the row again (at-least-once).
	AckRide time.Duration
	// RecordRide is how long the records of rows AcceptBatch queued (a leaf's pulled rows)
	// wait for a commit made anyway before one is made for them; 0: one is made at once.
	// The rows are in the queue in memory meanwhile, and a reply to one of them, or a read
	// of it, has its commit made then (awaitRecord). Only a caller whose rows are still held
	// elsewhere until that commit is done (a hub's mailbox) may use it.
	RecordRide time.Duration
	// OwnSockets are the paths of the daemon's own listening sockets. A session file whose
	// messagingSocketPath names one of them would have the daemon deliver to itself and
	// report it delivered; such a delivery is refused instead.
	OwnSockets []string
	// ReplyTo is the reply address ("uds:<path>") of the daemon's socket for Claude Code's
	// peer status reports, named in every inbox line with the message's id; "" for none
	// (the lines are the original's, and a record says only that the line was written).
	ReplyTo string
	// Fed reaches other nodes; nil means no federation (every remote ref is unknown_peer).
	Fed Federation
	// Leaf, when set, makes this bus a leaf's (docs/protocol.md §7.5): it serves one local
	// service, admitted on uid alone, and no other registration.
	Leaf *LeafService
	// Harnesses are the harnesses the bus routes to; nil means Builtin.
	Harnesses *harness.Registry
	// Now is the clock every record's time and every TTL is read from; nil means time.Now.
	// Tests pass their own, so that no test sleeps for a TTL to pass.
	Now func() time.Time
	// Bounds are the shares of what senders share: a queue's places per origin, a leaf's
	// mailbox (queue.go).
	Bounds Bounds
	// Events is the daemon's event stream: every change of a message's life the bus or a
	// transport makes is announced there (nil: announced nowhere).
	Events *ledger.Stream
}

// Builtin are xmsg's harnesses, in listing order.
func Builtin() []harness.Harness {
	return []harness.Harness{claude.Harness, agy.Harness, codex.Harness, uid.Pi, uid.OpenCode, uid.Hermes, uid.CLI, svc.Harness}
}

// Bus is the router. Safe for concurrent use.
type Bus struct {
	cfg     Config
	h       *harness.Registry
	mu      sync.Mutex
	regs    map[string]*Registration
	regIdx  regIndex // regs by what a ref names (resolveRegistered)
	replies wake.Set // keyed by message id
	queues  wake.Set // keyed by session id
	acks    wake.Set // keyed by message id: a queued message was acknowledged
	waiters chan struct{}
	keys    keyLocks
	stop    chan struct{}
	stopped sync.WaitGroup
	locks   *lockwatch.Watcher // follows the locks of leases; nil without Codex
	lim     ratelog.Limiter    // refusal log lines
	q       queueState
	// pidfdOnce logs once that registrations fall back to /proc checks.
	pidfdOnce sync.Once
	ownMu     sync.Mutex
	ownFiles  []os.FileInfo // the daemon's sockets once found (see ownSocket)
}

// New builds a bus and starts its retention loop.
func New(cfg Config) *Bus {
	if cfg.InboxTimeout == 0 {
		cfg.InboxTimeout = claude.InboxTimeout
	}
	if cfg.Exe == nil {
		cfg.Exe = cfg.Proc.Exe
	}
	if cfg.MaxWaiters == 0 {
		cfg.MaxWaiters = limits.HTTPMaxWaiters
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Harnesses == nil {
		cfg.Harnesses, _ = harness.NewRegistry(Builtin()...) // distinct names and prefixes
	}
	b := &Bus{cfg: cfg, h: cfg.Harnesses, regs: map[string]*Registration{}, waiters: make(chan struct{}, cfg.MaxWaiters), stop: make(chan struct{})}
	if cfg.Codex != nil || cfg.Agy != nil {
		w, err := lockwatch.New(b.locksGone, cfg.Log)
		if err != nil {
			// Without the watch no lease could end with its lock: grant none (fail closed).
			cfg.Log.Error("codex and agy sessions disabled: lock watch unavailable", "err", err)
		}
		b.locks = w
	}
	b.q.init()
	cfg.Store.SetRider(b.rideAcks)
	b.stopped.Add(2)
	go b.retention()
	go func() { defer b.stopped.Done(); b.flushAcks() }()
	return b
}

// Close stops background work. The store is closed by its owner.
func (b *Bus) Close() {
	close(b.stop)
	b.stopped.Wait()
	if b.locks != nil {
		b.locks.Close()
	}
}

// Events is the stream the bus and its transports announce a message's life on.
func (b *Bus) Events() *ledger.Stream { return b.cfg.Events }

// Host is the host label.
func (b *Bus) Host() string { return b.cfg.Host }

// Harnesses are the harnesses this bus routes to.
func (b *Bus) Harnesses() *harness.Registry { return b.h }

// retention purges old rows at start and then every minute. The protocol purges on every
// send; doing it on a timer keeps full scans off the send path, and lookups ignore expired
// rows anyway, so the observable rules are the same.
func (b *Bus) retention() {
	defer b.stopped.Done()
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		b.Purge(b.cfg.Now())
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
	}
}

// Purge applies the retention rules as of now.
func (b *Bus) Purge(now time.Time) {
	var p store.Purged
	err := b.cfg.Store.Update(func(tx *store.Tx) (err error) {
		p, err = tx.Purge(now.Add(-b.cfg.ReplyTTL).Unix(), now.Add(-b.cfg.IdemTTL).Unix())
		return err
	})
	if err != nil {
		b.cfg.Log.Error("purge failed", "err", err)
	} else if p != (store.Purged{}) {
		if p.Queued > 0 {
			b.forgetCounts()
		}
		b.cfg.Log.Info("purged", "messages", p.Messages, "replies", p.Replies, "queued", p.Queued, "idempotency_keys", p.IdempotencyKeys)
	}
	if n, err := b.pruneProcessSessions(); err != nil {
		b.cfg.Log.Error("pruning session ids failed", "err", err)
	} else if n > 0 {
		b.cfg.Log.Info("purged", "session_ids", n)
	}
}

// Caller is an attested identity: derived from the kernel and /proc, never from a request.
type Caller struct {
	Harness   string
	SessionID string
	Name      string // display name; the session id when the session has none

	path string        // the session file a claude caller was attributed to
	reg  *Registration // the registration a registered caller was attributed to
}

// Actor is the caller's audit name, e.g. "claude:alice".
func (c Caller) Actor() string { return c.Harness + ":" + c.Name }

// Session is a live session as the session list shows it (docs/protocol.md §3.3).
type Session struct {
	SessionID string
	// Name, Entrypoint and Version are nil where the session has none (a Claude session
	// file may leave them out).
	Name       *string
	PID        int
	Cwd        string
	Status     string
	Kind       string
	Entrypoint *string
	Version    *string
	// StartedAt and UpdatedAt are JSON numbers as the session file has them (a registered
	// session's: its registration's epoch seconds); empty when the file has none.
	StartedAt, UpdatedAt json.RawMessage
	Harness              string
	// Registered: whether the session is registered (an agy session: whether its credentials
	// are); nil for a Claude session, which never registers.
	Registered *bool
}

func claudeEntry(s claude.Session) Session {
	return Session{SessionID: s.ID, Name: s.Name, PID: s.PID, Cwd: s.Cwd, Status: s.Status, Kind: s.Kind,
		Entrypoint: s.Entrypoint, Version: s.Version, StartedAt: s.StartedAt, UpdatedAt: s.UpdatedAt, Harness: claude.Name}
}

func (b *Bus) regEntry(r *Registration) Session {
	name, t, yes := r.Name, json.RawMessage(strconv.FormatInt(r.RegisteredAt, 10)), true
	kind := "interactive"
	if h := b.h.Named(r.Harness); h != nil {
		kind = h.Kind()
	}
	return Session{SessionID: r.SessionID, Name: &name, PID: r.PID, Cwd: r.Cwd, Status: "idle", Kind: kind,
		StartedAt: t, UpdatedAt: t, Harness: r.Harness, Registered: &yes}
}

// Sessions lists live sessions: claude first, then registered sessions, then services.
// cwd keeps entries whose cwd equals or is under it; status keeps an exact match.
func (b *Bus) Sessions(cwd, status string) []Session {
	out := []Session{}
	keep := func(v Session) {
		if cwd != "" && v.Cwd != cwd && !strings.HasPrefix(v.Cwd, strings.TrimSuffix(cwd, "/")+"/") {
			return
		}
		if status != "" && v.Status != status {
			return
		}
		out = append(out, v)
	}
	for _, s := range b.cfg.Claude.Scan() {
		if s.Live {
			keep(claudeEntry(s))
		}
	}
	b.codexThreads()
	for _, r := range b.liveRegistrations() {
		if r.agy != nil {
			keep(b.agyEntry(r))
		} else {
			keep(b.regEntry(r))
		}
	}
	return out
}

// SessionDirs is the state of the Claude session directories, for /healthz.
type SessionDirs struct {
	// Configured: this bus serves session directories at all (a leaf serves none, and its
	// /healthz says nothing about them). The fields below are read only when it does.
	Configured bool
	Present    bool // any directory exists
	// Readable: any directory can be listed (under Landlock one replaced after start exists
	// but is denied).
	Readable bool
	Problems []string // directories that exist but are not served, with the reason
}

// SessionDirs reports the session directories' state. A bus without any opens nothing to
// answer.
func (b *Bus) SessionDirs() SessionDirs {
	if b.cfg.Claude == nil || len(b.cfg.Claude.Dirs) == 0 {
		return SessionDirs{}
	}
	return SessionDirs{Configured: true, Present: b.cfg.Claude.AnyDir(), Readable: b.cfg.Claude.AnyDirReadable(), Problems: b.cfg.Claude.Problems()}
}

// Target is a resolved local recipient.
type Target struct {
	Harness   string
	SessionID string
	Claude    *claude.Session // for claude targets
	Session   Session
	// Offline: a configured service that is not registered right now, or an agy session
	// without credentials named by something else than its session id. It can be sent to
	// (its queue is durable) but GET does not show it as a live session.
	Offline bool
	reg     *Registration // for agy targets
}

// Resolve finds the one live local session ref names (docs/protocol.md §5.2). A harness prefix
// pins the search to that harness: "svc:guard" never resolves to a session that merely
// calls itself "svc:guard", whatever its harness.
func (b *Bus) Resolve(ref string) (Target, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return Target{}, notFound(ref)
	}
	pinned, bare := b.h.Split(ref)
	// in reports whether the ref may mean a session admitted as a: no prefix, or that of
	// such a harness.
	in := func(a harness.Admission) bool { return pinned == nil || pinned.Admission() == a }
	pid, numErr := strconv.Atoi(bare)
	isPID := numErr == nil && pid > 0
	var live, dead []claude.Session
	var incomplete error
	if in(harness.SessionFile) {
		lookupPID := 0
		if isPID {
			lookupPID = pid
		}
		// Only the files this ref can mean are looked at, and only their processes checked.
		var sessions []claude.Session
		sessions, incomplete = b.cfg.Claude.Lookup(bare, lookupPID)
		for _, s := range sessions {
			if s.Live {
				live = append(live, s)
			} else {
				dead = append(dead, s)
			}
		}
	}
	if incomplete != nil {
		// Some session files could not be read for lack of descriptors or memory: whatever
		// this scan found or missed, an answer now could be wrong (a live session reported
		// not found), so none is given. The client may retry.
		b.lim.Log(b.cfg.Log, slog.LevelError, "scan incomplete", "session scan incomplete", "err", incomplete)
		return Target{}, errorf(ledger.ServiceUnavailable, "session directory unreadable for lack of resources; retry later")
	}
	switch {
	case len(live) == 1:
		s := live[0]
		return Target{Harness: claude.Name, SessionID: s.ID, Claude: &s, Session: claudeEntry(s)}, nil
	case len(live) > 1:
		ids := make([]string, len(live))
		for i, s := range live {
			ids[i] = s.ID
		}
		return Target{}, errorf(ledger.Ambiguous, "%s", strings.Join(ids, ","))
	}
	if in(harness.Presence) {
		if t, err, ok := b.resolveAgy(bare); ok {
			return t, err
		}
	}
	if pinned == nil || (pinned.Admission() != harness.SessionFile && pinned.Admission() != harness.Presence) {
		if t, err, ok := b.resolveRegistered(pinned, bare, isPID, pid); ok {
			return t, err
		}
		// A Codex thread that has not called an xmsg tool yet is found by its lock.
		if b.cfg.Codex != nil && (pinned == nil || pinned.Name() == codex.Name) {
			b.codexThreads()
			if t, err, ok := b.resolveRegistered(pinned, bare, isPID, pid); ok {
				return t, err
			}
		}
	}
	if len(dead) > 0 {
		d := dead[0]
		_, err := b.cfg.Proc.StartTime(d.PID)
		if err == nil {
			return Target{}, unregistered(d.PID)
		}
		if ledger.OutOfResources(err) {
			// /proc could not be read: the process may be alive, so "gone" could be wrong.
			return Target{}, errorf(ledger.ServiceUnavailable, "process state unreadable for lack of resources; retry later")
		}
		return Target{}, errorf(ledger.Gone, "session %s process %d exited", d.ID, d.PID)
	}
	// A bare name that matched no session, live or dead, names a configured service that is
	// not connected as svc:<name> does (docs/protocol.md §5.2): the last step of the order,
	// so a session of that name always comes first.
	if pinned == nil {
		if t, ok := b.offlineService(nil, bare); ok {
			return t, nil
		}
	}
	if isPID {
		if _, err := b.cfg.Proc.StartTime(pid); err == nil {
			return Target{}, unregistered(pid)
		}
	}
	return Target{}, notFound(ref)
}

// resolveRegistered matches registered sessions, then services (only those of pinned when
// it is set): by session id, by name, or by pid; case-insensitive. ok is false when nothing
// matched.
func (b *Bus) resolveRegistered(pinned harness.Harness, bare string, isPID bool, pid int) (Target, error, bool) {
	name := ""
	if pinned != nil {
		name = pinned.Name()
	}
	b.mu.Lock()
	named := b.regIdx.named(bare, isPID, pid)
	b.mu.Unlock()
	regs := named[:0]
	for _, r := range named {
		if r.agy == nil && (name == "" || r.Harness == name) {
			regs = append(regs, r)
		}
	}
	b.sortRegistrations(regs)
	for _, services := range []bool{false, true} {
		var hits []*Registration
		for _, r := range regs {
			// Liveness only for the registrations that match (their pidfd says at once).
			if b.h.Is(r.Harness, harness.Exe) == services && b.regAlive(r) {
				hits = append(hits, r)
			}
		}
		if len(hits) == 1 {
			r := hits[0]
			return Target{Harness: r.Harness, SessionID: r.SessionID, Session: b.regEntry(r)}, nil, true
		}
		if len(hits) > 1 {
			ids := make([]string, len(hits))
			for i, r := range hits {
				ids[i] = r.SessionID
			}
			return Target{}, errorf(ledger.Ambiguous, "%s", strings.Join(ids, ",")), true
		}
	}
	// A uid-admitted session's id is durable and its queue too: while its process lives it
	// stays addressable by that id, also between a daemon restart and its re-registration.
	if pinned == nil || pinned.Admission() == harness.UID {
		if rec, ok := b.liveProcessSession(bare, name); ok {
			return Target{Harness: rec.Harness, SessionID: rec.SessionID, Offline: true}, nil, true
		}
	}
	if pinned != nil && pinned.Admission() == harness.Exe {
		if t, ok := b.offlineService(pinned, bare); ok {
			return t, nil, true
		}
	}
	return Target{}, nil, false
}

// offlineService finds a configured service (by --svc-exe, or a leaf's own) named bare that is
// not registered right now: a service queues durably, so it stays addressable by its stable id
// while it reconnects. h is a harness admitted by executable, nil for the first of them.
func (b *Bus) offlineService(h harness.Harness, bare string) (Target, bool) {
	if h == nil {
		for _, x := range b.h.All() {
			if x.Admission() == harness.Exe {
				h = x
				break
			}
		}
		if h == nil {
			return Target{}, false
		}
	}
	name := h.Name()
	offline := func(n string) Target {
		return Target{Harness: name, SessionID: name + ":" + n, Offline: true, Session: Session{Name: &n}}
	}
	if l := b.cfg.Leaf; l != nil && strings.EqualFold(l.Name, bare) {
		return offline(l.Name), true
	}
	for n := range b.cfg.SvcExe {
		if strings.EqualFold(n, bare) {
			return offline(n), true
		}
	}
	return Target{}, false
}

// identify attributes a peer pid to a session by walking its ancestors (at most 32): a live
// Claude session whose pid and procStart match, or a registration whose pid and start time
// match (docs/protocol.md §4.1). A caller that descends from a trusted Codex process is a
// Codex session only with a _meta (raw JSON, or nil) naming a thread that process writes;
// without one it is refused, never attributed to whatever else its ancestry would match. The
// _meta of any other caller is ignored. It also returns the ancestry from pid up to and
// including the process the caller was attributed to (Attest keeps it).
func (b *Bus) identify(pid int, meta json.RawMessage) (Caller, []peercred.Stat, error) {
	chain, err := b.cfg.Proc.Ancestors(pid, 32)
	if err != nil && ledger.OutOfResources(err) {
		return Caller{}, nil, errorf(ledger.ServiceUnavailable, "process ancestry unreadable for lack of resources; retry later")
	}
	if err == nil {
		regs := b.registrations()
		for i, st := range chain {
			sessions, incomplete := b.cfg.Claude.ByPID(st.PID)
			if incomplete != nil {
				return Caller{}, nil, errorf(ledger.ServiceUnavailable, "session directory unreadable for lack of resources; retry later")
			}
			for _, s := range sessions {
				// The chain entry's own start time must match too: Live was read at scan
				// time, and a pid reused since then is another process.
				if s.Live && s.PID == st.PID && s.Start() == st.StartTime {
					name := s.ID
					if s.Name != nil && *s.Name != "" {
						name = *s.Name
					}
					return Caller{Harness: claude.Name, SessionID: s.ID, Name: name, path: s.Path}, chain[:i+1], nil
				}
			}
			for _, r := range regs {
				// A Codex process may write several threads: which one a call is for is
				// decided by its _meta below, never by the pid alone. The chain entry was
				// just read: a matching start time is the live process (an agy session
				// must also still hold its presence lock).
				if !b.h.Is(r.Harness, harness.Lease) && r.PID == st.PID && r.Start == st.StartTime && (r.agy == nil || b.regAlive(r)) {
					c := r.Caller()
					c.reg = r
					return c, chain[:i+1], nil
				}
			}
			if b.cfg.Codex.IsCodex(st.PID) {
				// Not remembered (no reg, no path): the thread is decided per call by _meta,
				// so Recheck always says no and every frame is attested again.
				c, err := b.codexCaller(st, meta)
				return c, chain[:i+1], err
			}
		}
	}
	return Caller{}, nil, errorf(ledger.NotRecipient, "peer PID %d does not descend from an active agent session", pid)
}

// Attested is a connection's attested caller, made once by Attest and checked again cheaply
// before each later frame by Recheck.
type Attested struct {
	Caller Caller
	pid    int    // the ancestor the caller was attributed to
	start  string // its start time
	// closer are the processes between the caller and that ancestor (the caller included):
	// none was a session at the walk, and Recheck says no once one is.
	closer []peercred.Stat
	bus    *Bus
}

// Attest walks pid's ancestry once (identify) and remembers whom it found.
func (b *Bus) Attest(pid int, meta json.RawMessage) (Attested, error) {
	c, chain, err := b.identify(pid, meta)
	if err != nil {
		return Attested{}, err
	}
	st := chain[len(chain)-1]
	return Attested{Caller: c, pid: st.PID, start: st.StartTime, closer: chain[:len(chain)-1], bus: b}, nil
}

// Recheck reports whether a's session is still the one it was: the ancestor still runs with
// the same start time, its session file (or registration) is still there with the same id,
// and no process closer to the caller has become a session since (a session file or a
// registration of its own: a walk would now stop there). It costs index lookups and a pidfd
// poll (or one /proc read), not an ancestor walk. (A closer process that becomes a trusted
// Codex binary by exec is not noticed: that takes a walk.)
// The connection's own process is the caller's to check (agentsock does, before every
// frame); when Recheck says no, the caller attests again (and gets the walk's full answer,
// including a refusal for lack of resources). A Codex caller is never remembered: its
// thread is named per call.
func (a Attested) Recheck() bool {
	b := a.bus
	c := a.Caller
	switch {
	case c.reg != nil:
		b.mu.Lock()
		same := b.regs[c.reg.SessionID] == c.reg && !b.registeredLocked(a.closer)
		b.mu.Unlock()
		if !same || !b.regAlive(c.reg) {
			return false
		}
		if b.cfg.Claude == nil {
			return true
		}
		claimed, err := b.cfg.Claude.Claims(a.closer)
		return err == nil && !claimed
	case c.path != "":
		// The attested file still names this process (same start time) under the same
		// address, and the process lives: the Scanner's shared refresh and the entry's
		// pidfd say so, without a walk or a /proc read.
		b.mu.Lock()
		registered := b.registeredLocked(a.closer)
		b.mu.Unlock()
		if registered {
			return false
		}
		still, err := b.cfg.Claude.Still(c.path, c.SessionID, a.pid, a.start, a.closer)
		return err == nil && still
	}
	return false
}

// registeredLocked reports whether one of procs (by pid and start time) holds a registration
// a walk would attribute it to. The caller holds b.mu.
func (b *Bus) registeredLocked(procs []peercred.Stat) bool {
	for _, st := range procs {
		for _, r := range b.regs {
			if !b.h.Is(r.Harness, harness.Lease) && r.PID == st.PID && r.Start == st.StartTime {
				return true
			}
		}
	}
	return false
}

// nowUnix is the bus clock in unix seconds, the unit of every stored time.
func (b *Bus) nowUnix() int64 { return b.cfg.Now().Unix() }

// fmtOrigin is the svc origin (docs/protocol.md §7.3) of a local sender: json.Marshal of the
// map {kind} or {kind, harness, sessionId} (keys sorted), written by hand as FedOrigin is
// (TestLocalOriginIsMarshal): one is written with every queued send.
func fmtOrigin(kind string, c *Caller) json.RawMessage {
	raw := make([]byte, 0, 64)
	if c == nil {
		raw = append(raw, `{"kind":`...)
		raw = jsonline.AppendString(raw, kind, true)
		return append(raw, '}')
	}
	raw = append(raw, `{"harness":`...)
	raw = jsonline.AppendString(raw, c.Harness, true)
	raw = append(raw, `,"kind":`...)
	raw = jsonline.AppendString(raw, kind, true)
	raw = append(raw, `,"sessionId":`...)
	raw = jsonline.AppendString(raw, c.SessionID, true)
	return append(raw, '}')
}
