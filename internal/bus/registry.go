package bus

import (
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/peercred"
)

// Registration is a live svc or uid-admitted session registered on register.sock. It lives in
// memory only: clients re-register after a daemon restart (docs/protocol.md §9).
type Registration struct {
	Harness      string // "svc", "pi", "opencode", "hermes"
	SessionID    string // "svc:<name>" or "<harness>:<uuid v4>"
	Name         string
	Cwd          string
	PID          int
	Start        string // /proc start time, the pid-reuse guard
	RegisteredAt int64
}

// Caller returns the attested identity of a registration.
func (r *Registration) Caller() Caller {
	return Caller{Harness: r.Harness, SessionID: r.SessionID, Name: r.Name}
}

// SessionHarnesses are the harnesses admitted on register.sock by uid alone.
var SessionHarnesses = map[string]bool{"pi": true, "opencode": true, "hermes": true}

func (b *Bus) checkUID(cred peercred.Cred) *Error {
	// The gate already refused other uids; checking again keeps registration fail-closed even
	// if a listener were ever served without the gate.
	if int(cred.UID) != os.Geteuid() {
		return errorf(http.StatusForbidden, "not_recipient", "peer UID %d does not match server UID %d", cred.UID, os.Geteuid())
	}
	return nil
}

// RegisterService admits a svc registration after exe attestation (docs/protocol.md §7.2).
// connectStart is the peer's start time as read when it connected ("" = not known): if the
// pid now belongs to another process, nothing is registered and nothing is replaced.
func (b *Bus) RegisterService(name, cwd string, cred peercred.Cred, connectStart string) (*Registration, error) {
	name = strings.TrimPrefix(strings.TrimSpace(name), "svc:")
	if name == "" {
		return nil, badRequest("service name must not be empty")
	}
	if err := b.checkUID(cred); err != nil {
		return nil, err
	}
	trusted, ok := b.cfg.SvcExe[name]
	if !ok {
		return nil, errorf(http.StatusForbidden, "not_recipient", "no trusted executable configured for service '%s'", name)
	}
	// Both sides are canonicalized now, not at startup: if the trusted path is a symlink that
	// was re-pointed, a process started from the old target no longer matches (fail closed).
	// Exe fails on a "(deleted)" executable.
	want, err1 := peercred.Canonical(trusted)
	got, err2 := b.cfg.Exe(cred.PID)
	if err1 != nil || err2 != nil || got != want {
		b.cfg.Log.Warn("svc attestation failed", "service", name, "peer_pid", cred.PID, "trusted_err", err1, "exe_err", err2)
		return nil, errorf(http.StatusForbidden, "not_recipient", "peer process %d executable does not match trusted executable for service '%s'", cred.PID, name)
	}
	start, err := b.cfg.Proc.StartTime(cred.PID)
	if err != nil {
		return nil, errorf(http.StatusForbidden, "not_recipient", "peer process %d is gone", cred.PID)
	}
	if connectStart != "" && start != connectStart {
		return nil, errorf(http.StatusForbidden, "not_recipient", "peer process %d is gone", cred.PID)
	}
	if cwd == "" {
		cwd = "/"
	}
	r := &Registration{Harness: "svc", SessionID: "svc:" + name, Name: name, Cwd: cwd, PID: cred.PID, Start: start, RegisteredAt: time.Now().Unix()}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old := b.regs[r.SessionID]; old != nil && (old.PID != r.PID || old.Start != r.Start) && b.cfg.Proc.Alive(old.PID, old.Start) {
		return nil, errorf(http.StatusConflict, "conflict", "service '%s' already has an active registration", r.SessionID)
	}
	b.regs[r.SessionID] = r
	return r, nil
}

// RegisterSession admits a pi/opencode/hermes session on uid alone, under a fresh UUID v4
// session id that only the owning connection can use. connectStart as for RegisterService.
func (b *Bus) RegisterSession(harness, name, cwd string, cred peercred.Cred, connectStart string) (*Registration, error) {
	if !SessionHarnesses[harness] {
		return nil, badRequest("unknown harness '%s'", harness)
	}
	if err := b.checkUID(cred); err != nil {
		return nil, err
	}
	start, err := b.cfg.Proc.StartTime(cred.PID)
	if err != nil {
		return nil, errorf(http.StatusForbidden, "not_recipient", "peer process %d is gone", cred.PID)
	}
	if connectStart != "" && start != connectStart {
		return nil, errorf(http.StatusForbidden, "not_recipient", "peer process %d is gone", cred.PID)
	}
	id := harness + ":" + uuid.NewString()
	if strings.TrimSpace(name) == "" {
		name = id
	}
	if cwd == "" {
		cwd = "/"
	}
	r := &Registration{Harness: harness, SessionID: id, Name: name, Cwd: cwd, PID: cred.PID, Start: start, RegisteredAt: time.Now().Unix()}
	b.mu.Lock()
	b.regs[id] = r
	b.mu.Unlock()
	return r, nil
}

// Unregister ends r, unless a newer registration already replaced it.
func (b *Bus) Unregister(r *Registration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.regs[r.SessionID] == r {
		delete(b.regs, r.SessionID)
	}
}

// liveRegistrations returns the live registrations (svc last), pruning dead ones.
func (b *Bus) liveRegistrations() []*Registration {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*Registration
	for id, r := range b.regs {
		if !b.cfg.Proc.Alive(r.PID, r.Start) {
			delete(b.regs, id)
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if (out[i].Harness == "svc") != (out[j].Harness == "svc") {
			return out[j].Harness == "svc"
		}
		return out[i].SessionID < out[j].SessionID
	})
	return out
}

// Registrations counts live registrations, for STATUS=.
func (b *Bus) Registrations() int { return len(b.liveRegistrations()) }
