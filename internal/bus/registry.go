package bus

import (
	"errors"
	"github.com/xmsg/xmsg/internal/codex"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/harness/svc"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

// Registration is a live svc or uid-admitted session registered on register.sock. It lives in
// memory only: clients re-register after a daemon restart (docs/protocol.md §9). The id of a
// uid-admitted session is durable, though: it belongs to the session process, not to the
// registration (see RegisterSession).
type Registration struct {
	bus          *Bus   // the bus it is installed in (Current)
	Harness      string // a harness name (Config.Harnesses)
	SessionID    string // "svc:<name>" or "<harness>:<uuid v4>"
	Name         string
	Cwd          string
	PID          int
	Start        string // /proc start time, the pid-reuse guard
	RegisteredAt int64
	// Lock is the lock file whose removal ends the registration (a lease's: a Codex writer
	// lock, an agy presence lock); "" for registrations that end with their connection.
	Lock string

	agy      *agySession   // what a presence-attested (agy) session holds beyond these
	replaced chan struct{} // closed when a newer registration of the same process takes over

	// watch tells when the process exits (a pidfd); nil where pidfds are unavailable, and
	// then liveness is read from /proc each time it matters.
	watch *peercred.Pidfd
}

// Replaced is closed when a newer registration by the same process took this one's place.
// The connection that owns r must then end: one session, one connection.
func (r *Registration) Replaced() <-chan struct{} { return r.replaced }

// Current reports whether r is still the registration in force for its session id.
func (r *Registration) Current() bool {
	b := r.bus
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.regs[r.SessionID] == r
}

// install makes r the registration for its id, ending an older one it replaces. Callers hold
// b.mu and have checked that replacing is allowed.
func (b *Bus) install(r *Registration) {
	r.bus = b
	r.replaced = make(chan struct{})
	if old := b.regs[r.SessionID]; old != nil && old != r {
		close(old.replaced)
	}
	b.dropReg(r.SessionID)
	b.regs[r.SessionID] = r
	b.regIdx.add(r)
}

// dropReg removes the registration of id, if any, from b.regs and its index. Call with b.mu
// held.
func (b *Bus) dropReg(id string) {
	if r := b.regs[id]; r != nil {
		b.regIdx.remove(r)
		delete(b.regs, id)
	}
}

// bareID is r's session id without its harness ("svc:x" is "x", "pi:<uuid>" is the uuid), as
// a ref names it (regIndex keys r by it): strings.TrimPrefix(r.SessionID, r.Harness+":").
func (r *Registration) bareID() string {
	id, h := r.SessionID, r.Harness
	if len(id) > len(h) && id[len(h)] == ':' && id[:len(h)] == h {
		return id[len(h)+1:]
	}
	return id
}

// Caller returns the attested identity of a registration.
func (r *Registration) Caller() Caller {
	return Caller{Harness: r.Harness, SessionID: r.SessionID, Name: r.Name}
}

func (b *Bus) checkUID(cred peercred.Cred) *Error {
	// The gate already refused other uids; checking again keeps registration fail-closed even
	// if a listener were ever served without the gate.
	if int(cred.UID) != os.Geteuid() {
		return errorf(ledger.NotRecipient, "peer UID %d does not match server UID %d", cred.UID, os.Geteuid())
	}
	return nil
}

// RegisterService admits a svc registration after exe attestation (docs/protocol.md §7.2).
// connectStart is the peer's start time as read when it connected ("" = not known): if the
// pid now belongs to another process, nothing is registered and nothing is replaced.
func (b *Bus) RegisterService(name, cwd string, cred peercred.Cred, connectStart string) (*Registration, error) {
	name = strings.TrimPrefix(strings.TrimSpace(name), svc.Name+":")
	if name == "" {
		return nil, badRequest("service name must not be empty")
	}
	if err := b.checkUID(cred); err != nil {
		return nil, err
	}
	if b.cfg.Leaf != nil {
		if err := b.leafService(name); err != nil {
			return nil, err
		}
	} else if err := b.attestService(name, cred); err != nil {
		return nil, err
	}
	start, err := b.cfg.Proc.StartTime(cred.PID)
	if err != nil {
		return nil, errorf(ledger.NotRecipient, "peer process %d is gone", cred.PID)
	}
	if connectStart != "" && start != connectStart {
		return nil, errorf(ledger.NotRecipient, "peer process %d is gone", cred.PID)
	}
	if cwd == "" {
		cwd = "/"
	}
	r := &Registration{Harness: svc.Name, SessionID: svc.Name + ":" + name, Name: name, Cwd: cwd, PID: cred.PID, Start: start, RegisteredAt: b.nowUnix()}
	if err := b.watch(r); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old := b.regs[r.SessionID]; old != nil && (old.PID != r.PID || old.Start != r.Start) && b.regAlive(old) {
		r.stop()
		return nil, errorf(ledger.Conflict, "service '%s' already has an active registration", r.SessionID)
	}
	// The same process registering again (or a new one after the old exited) takes over.
	b.install(r)
	return r, nil
}

// attestService checks that the peer runs the executable configured for service name.
func (b *Bus) attestService(name string, cred peercred.Cred) *Error {
	trusted, ok := b.cfg.SvcExe[name]
	if !ok {
		return errorf(ledger.NotRecipient, "no trusted executable configured for service '%s'", name)
	}
	// Both sides are canonicalized now, not at startup: if the trusted path is a symlink that
	// was re-pointed, a process started from the old target no longer matches (fail closed).
	// Exe fails on a "(deleted)" executable.
	want, err1 := peercred.Canonical(trusted)
	got, err2 := b.cfg.Exe(cred.PID)
	if err1 != nil || err2 != nil || got != want {
		b.lim.Log(b.cfg.Log, slog.LevelWarn, "svc attestation failed", "svc attestation failed", "service", name, "peer_pid", cred.PID, "trusted_err", err1, "exe_err", err2)
		return errorf(ledger.NotRecipient, "peer process %d executable does not match trusted executable for service '%s'", cred.PID, name)
	}
	return nil
}

// RegisterSession admits a pi/opencode/hermes session on uid alone. Its id is a UUID v4 minted
// the first time the process (boot id, pid, start time) registers and kept in the store: every
// later registration by the same live process, on a new connection or after a daemon
// restart, gets the same id and takes over from the older registration (whose connection
// then ends). Queued messages and reply rights follow the id, so nothing is stranded on a
// connection that is no longer polled. Another process, or the same pid with another start
// time, never matches the record. No id in the request is ever used. connectStart as for
// RegisterService.
func (b *Bus) RegisterSession(kind, name, cwd string, cred peercred.Cred, connectStart string) (*Registration, error) {
	if !b.h.Is(kind, harness.UID) {
		return nil, badRequest("unknown harness '%s'", kind)
	}
	if b.cfg.Leaf != nil {
		// A leaf serves exactly one service (docs/protocol.md §7.5).
		return nil, errorf(ledger.NotRecipient, "a leaf admits only its service '%s' (leaf principal '%s')", b.cfg.Leaf.Name, b.cfg.Leaf.Principal)
	}
	if err := b.checkUID(cred); err != nil {
		return nil, err
	}
	start, err := b.cfg.Proc.StartTime(cred.PID)
	if err != nil {
		return nil, errorf(ledger.NotRecipient, "peer process %d is gone", cred.PID)
	}
	if connectStart != "" && start != connectStart {
		return nil, errorf(ledger.NotRecipient, "peer process %d is gone", cred.PID)
	}
	id, err := b.processSessionID(kind, cred.PID, start)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(name) == "" {
		name = id
	}
	if cwd == "" {
		cwd = "/"
	}
	r := &Registration{Harness: kind, SessionID: id, Name: name, Cwd: cwd, PID: cred.PID, Start: start, RegisteredAt: b.nowUnix()}
	if err := b.watch(r); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.install(r)
	b.mu.Unlock()
	return r, nil
}

// watch starts watching r's process for its exit. Without pidfds (old kernels, other
// systems) r is registered unwatched and checked in /proc whenever it is used.
func (b *Bus) watch(r *Registration) error {
	w, err := b.cfg.Proc.OpenPidfd(r.PID, r.Start)
	switch {
	case err == nil:
		r.watch = w
		go func() {
			if w.Wait() {
				b.gone(r)
			}
		}()
	case errors.Is(err, peercred.ErrExited):
		return errorf(ledger.NotRecipient, "peer process %d is gone", r.PID)
	default:
		b.pidfdOnce.Do(func() {
			b.cfg.Log.Warn("registrations cannot be watched; their processes are checked in /proc instead", "err", err)
		})
	}
	return nil
}

// gone drops r once its process has exited (called by its watch).
func (b *Bus) gone(r *Registration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.regs[r.SessionID] == r {
		b.dropReg(r.SessionID)
	}
}

func (r *Registration) stop() {
	if r.watch != nil {
		r.watch.Close()
	}
}

// Alive reports whether r's process is still the one that registered: one poll(2) on its
// pidfd, or a /proc read where there is none.
func (b *Bus) Alive(r *Registration) bool {
	if r.watch != nil {
		if exited, known := r.watch.Exited(); known {
			return !exited
		}
	}
	return b.cfg.Proc.Alive(r.PID, r.Start)
}

// regAlive reports whether r is live: its process is (Alive), an agy session still holds
// its presence lock (docs/protocol.md §3.3), and a Codex lease's process still runs a trusted
// Codex executable (a copy deleted, replaced or no longer equal to a --codex-exe ends it).
func (b *Bus) regAlive(r *Registration) bool {
	if r.agy != nil && !b.cfg.Agy.Held(r.agy.presence) {
		return false
	}
	if !b.Alive(r) {
		return false
	}
	return r.Harness != codex.Name || b.cfg.Codex.IsCodex(r.PID)
}

// registrations is a snapshot of every registration, live or not, in listing order: agy,
// then sessions (pi, opencode, hermes, codex), then services. Liveness is the caller's to
// check, for the registrations it uses.
func (b *Bus) registrations() []*Registration {
	b.mu.Lock()
	out := make([]*Registration, 0, len(b.regs))
	for _, r := range b.regs {
		out = append(out, r)
	}
	b.mu.Unlock()
	b.sortRegistrations(out)
	return out
}

// sortRegistrations puts rs in listing order: by their harness's rank, then by session id.
func (b *Bus) sortRegistrations(rs []*Registration) {
	rank := func(r *Registration) int {
		if h := b.h.Named(r.Harness); h != nil {
			return h.Rank()
		}
		return 1
	}
	sort.Slice(rs, func(i, j int) bool {
		if rank(rs[i]) != rank(rs[j]) {
			return rank(rs[i]) < rank(rs[j])
		}
		return rs[i].SessionID < rs[j].SessionID
	})
}

// processSessionID returns the durable id of the session process (harness, pid, start),
// minting and committing one if it has none. Lookup and insert are one transaction, so two
// registrations racing for the same process agree on one id.
func (b *Bus) processSessionID(harness string, pid int, start string) (string, error) {
	boot, err := b.cfg.Proc.BootID()
	if err != nil {
		// Without the boot id a record could be inherited by a process of a later boot.
		b.cfg.Log.Error("boot id unreadable; session ids cannot be kept", "err", err)
		return "", errorf(ledger.Internal, "internal error")
	}
	minted := store.ProcessSession{Harness: harness, Boot: boot, PID: pid, Start: start,
		SessionID: harness + ":" + uuid.NewString(), CreatedAt: b.nowUnix()}
	var id string
	err = b.cfg.Store.Update(func(tx *store.Tx) error {
		rec, found, err := tx.ProcessSession(harness, boot, pid, start)
		if err != nil {
			return err
		}
		if found {
			id = rec.SessionID
			return nil
		}
		id = minted.SessionID
		return tx.PutProcessSession(minted)
	})
	return id, err
}

// liveProcessSession finds the durable id record of a uid-admitted session whose process is
// alive in this boot, by its id (with or without the harness prefix; harness "" = any).
func (b *Bus) liveProcessSession(id, harness string) (store.ProcessSession, bool) {
	boot, err := b.cfg.Proc.BootID()
	if err != nil || id == "" {
		return store.ProcessSession{}, false
	}
	var recs []store.ProcessSession
	if err := b.cfg.Store.View(func(tx *store.Tx) (err error) { recs, err = tx.ProcessSessions(); return err }); err != nil {
		return store.ProcessSession{}, false
	}
	for _, rec := range recs {
		if harness != "" && rec.Harness != harness {
			continue
		}
		if !strings.EqualFold(rec.SessionID, id) && !strings.EqualFold(strings.TrimPrefix(rec.SessionID, rec.Harness+":"), id) {
			continue
		}
		if rec.Boot == boot && b.cfg.Proc.Alive(rec.PID, rec.Start) {
			return rec, true
		}
	}
	return store.ProcessSession{}, false
}

// pruneProcessSessions forgets the ids of session processes that exited (or ran in an earlier
// boot): such a process never registers again, so its record would only grow the store. It
// writes (and fsyncs) only when there is something to forget.
func (b *Bus) pruneProcessSessions() (int, error) {
	boot, err := b.cfg.Proc.BootID()
	if err != nil {
		return 0, err
	}
	var dead []store.ProcessSession
	err = b.cfg.Store.View(func(tx *store.Tx) error {
		recs, err := tx.ProcessSessions()
		for _, rec := range recs {
			if rec.Boot != boot || !b.cfg.Proc.Alive(rec.PID, rec.Start) {
				dead = append(dead, rec)
			}
		}
		return err
	})
	if err != nil || len(dead) == 0 {
		return 0, err
	}
	// A dead process stays dead, so deleting outside the reading transaction is safe.
	err = b.cfg.Store.Update(func(tx *store.Tx) error {
		for _, rec := range dead {
			if err := tx.DeleteProcessSession(rec); err != nil {
				return err
			}
		}
		return nil
	})
	return len(dead), err
}

// Unregister ends r, unless a newer registration already replaced it.
func (b *Bus) Unregister(r *Registration) {
	r.stop()
	if !b.h.Is(r.Harness, harness.Exe) {
		// Forget the queue: it is loaded again from the store should the id register again
		// (the same session process on a new connection). Ids of uid-admitted sessions are
		// minted per process, so keeping their queues would grow memory without bound.
		b.uncounted(r.SessionID)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.regs[r.SessionID] == r {
		b.dropReg(r.SessionID)
	}
}

// liveRegistrations returns the live registrations in listing order, checking each: for
// listing and counting. Resolving a ref checks only the registrations it matches. An
// unwatched registration found dead is pruned (a watched one is pruned by its watch).
func (b *Bus) liveRegistrations() []*Registration {
	var out []*Registration
	for _, r := range b.registrations() {
		if b.regAlive(r) {
			out = append(out, r)
		} else if r.watch == nil || r.agy != nil {
			b.gone(r)
		}
	}
	return out
}

// LeafService is the one service a leaf's bus serves (docs/protocol.md §7.5).
type LeafService struct {
	Name      string // the service admitted, on uid alone
	Principal string // the leaf principal it is named after (--leaf-principal), for refusals
}

// leafService admits a registration in leaf mode: only the leaf principal's service name,
// on uid alone (the caller checked the uid). There is no executable to attest: in a pod the
// service runs in another container, whose files the leaf cannot see.
func (b *Bus) leafService(name string) *Error {
	if name != b.cfg.Leaf.Name {
		return errorf(ledger.NotRecipient, "service '%s' does not match leaf principal '%s'", name, b.cfg.Leaf.Principal)
	}
	return nil
}
