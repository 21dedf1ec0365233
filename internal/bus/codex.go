package bus

import (
	"encoding/json"
	"path/filepath"
	"strings"

	"github.com/xmsg/xmsg/internal/codex"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
)

// codexCaller attests st as the Codex process writing the thread named by meta, renews the
// thread's lease (its registration, addressable until the lock goes away) and returns the
// caller.
func (b *Bus) codexCaller(st peercred.Stat, raw json.RawMessage) (Caller, error) {
	m, err := codex.DecodeMeta(raw)
	if err != nil {
		return Caller{}, errorf(ledger.Unattested, "codex session call: %s", strings.TrimPrefix(err.Error(), "codex: "))
	}
	if m.Thread() == "" {
		return Caller{}, errorf(ledger.Unattested, "codex session call without params._meta (sessionId/threadId): the thread is never taken from tool arguments")
	}
	lease, err := b.cfg.Codex.Attest(st.PID, m.Thread())
	if err != nil {
		b.cfg.Log.Warn("codex attestation failed", "peer_pid", st.PID, "thread", m.Thread(), "err", err)
		return Caller{}, errorf(ledger.Unattested, "process %d does not write codex thread %s", st.PID, m.Thread())
	}
	r, err := b.codexLease(st, lease)
	if err != nil {
		return Caller{}, err
	}
	return r.Caller(), nil
}

// codexLease makes lease, attested for the process st, a registration (addressable until its
// lock goes away), or renews the one that exists.
func (b *Bus) codexLease(st peercred.Stat, lease codex.Lease) (*Registration, error) {
	if b.locks == nil {
		return nil, errorf(ledger.Unattested, "codex leases cannot be watched")
	}
	// Watch before the lease exists: a lock removed in between is then reported, not missed.
	if err := b.locks.Watch(codex.LockDir(lease.Lock)); err != nil {
		b.cfg.Log.Warn("codex lock dir not watchable", "err", err)
		return nil, errorf(ledger.Unattested, "codex thread %s: its lock cannot be watched", lease.Thread)
	}
	// The lock may have gone between the attestation and the watch.
	if _, err := b.cfg.Codex.Attest(st.PID, lease.Thread); err != nil {
		return nil, errorf(ledger.Unattested, "process %d does not write codex thread %s", st.PID, lease.Thread)
	}
	id := codex.Name + ":" + lease.Thread
	cwd := lease.Cwd
	if cwd == "" {
		cwd = "/"
	}
	b.mu.Lock()
	r := b.regs[id]
	if r == nil || r.PID != st.PID || r.Start != st.StartTime || r.Lock != lease.Lock {
		r = &Registration{Harness: codex.Name, SessionID: id, Name: lease.Thread, Cwd: cwd, PID: st.PID, Start: st.StartTime,
			RegisteredAt: b.nowUnix(), Lock: lease.Lock}
		b.install(r)
		b.cfg.Log.Info("codex lease", "session_id", id, "peer_pid", st.PID)
	}
	b.mu.Unlock()
	return r, nil
}

// codexThreads leases the threads that trusted Codex processes write but that have not
// called an xmsg tool yet, so that they are listed and addressable from the start. A known
// thread whose registration is alive is not attested again.
func (b *Bus) codexThreads() {
	if b.cfg.Codex == nil {
		return
	}
	known := func(thread string) bool {
		b.mu.Lock()
		r := b.regs[codex.Name+":"+thread]
		b.mu.Unlock()
		return r != nil && b.regAlive(r)
	}
	for _, lease := range b.cfg.Codex.Threads(known) {
		st, err := b.cfg.Proc.Stat(lease.PID)
		if err != nil {
			continue
		}
		b.codexLease(st, lease)
	}
}

// locksGone ends the leases whose lock went away: name in dir, or every lock in dir when
// name is "".
func (b *Bus) locksGone(dir, name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, r := range b.regs {
		if r.Lock == "" || filepath.Dir(r.Lock) != dir || (name != "" && filepath.Base(r.Lock) != name) {
			continue
		}
		b.dropReg(id)
		close(r.replaced)
		b.cfg.Log.Info("lease ended: lock gone", "session_id", id)
	}
}

// Ancestry names the harness a walk from pid would attribute it to, without attesting a Codex
// thread (no _meta is needed): codex when a trusted Codex process comes before any other
// session, else the harness of the session found, else "". The MCP bridge asks it once at
// start to decide which tools it offers.
func (b *Bus) Ancestry(pid int) string {
	c, _, err := b.identify(pid, nil)
	if err == nil {
		return c.Harness
	}
	// The walk stopped at a Codex process (a call without _meta is refused there) or found
	// nothing: only the first says codex.
	walk, err := b.cfg.Proc.Ancestors(pid, 32)
	if err != nil || b.cfg.Codex == nil {
		return ""
	}
	for _, st := range walk {
		if b.cfg.Codex.IsCodex(st.PID) {
			return codex.Name
		}
	}
	return ""
}
