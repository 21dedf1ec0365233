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
	if b.locks == nil {
		return Caller{}, errorf(ledger.Unattested, "codex leases cannot be watched")
	}
	// Watch before the lease exists: a lock removed in between is then reported, not missed.
	if err := b.locks.Watch(codex.LockDir(lease.Lock)); err != nil {
		b.cfg.Log.Warn("codex lock dir not watchable", "err", err)
		return Caller{}, errorf(ledger.Unattested, "codex thread %s: its lock cannot be watched", m.Thread())
	}
	// The lock may have gone between the attestation and the watch.
	if _, err := b.cfg.Codex.Attest(st.PID, m.Thread()); err != nil {
		return Caller{}, errorf(ledger.Unattested, "process %d does not write codex thread %s", st.PID, m.Thread())
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
	return r.Caller(), nil
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
		delete(b.regs, id)
		close(r.replaced)
		b.cfg.Log.Info("lease ended: lock gone", "session_id", id)
	}
}
