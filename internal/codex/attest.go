package codex

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/xmsg/xmsg/internal/peercred"
)

// Config of an Attester.
type Config struct {
	Exes  []string // trusted Codex executables (`--codex-exe`)
	Homes []string // Codex homes (`--codex-home`), absolute
	// Exe and Files read another process's /proc/<pid>/exe and /proc/<pid>/fd; a sandboxed
	// daemon passes the exehelper's.
	Exe   func(pid int) (string, error)
	Files func(pid int) ([]peercred.OpenFile, error)
}

// Attester checks Codex sessions. Safe for concurrent use.
type Attester struct{ cfg Config }

// New returns an attester, or nil when no Codex executable or home is configured (then no
// process is ever a Codex session).
func New(cfg Config) *Attester {
	if len(cfg.Exes) == 0 || len(cfg.Homes) == 0 {
		return nil
	}
	return &Attester{cfg: cfg}
}

// Lease is an attested thread: the process that writes it, and the lock whose removal ends it.
type Lease struct {
	Thread string // thread id (lowercase UUID)
	PID    int    // the trusted Codex process holding the lock
	Lock   string // canonical path of the lock file
	Cwd    string // from the rollout header
}

// IsCodex reports whether pid runs one of the trusted Codex executables. Both sides are
// canonicalized now, as for services: a re-pointed symlink or a deleted binary fails.
func (a *Attester) IsCodex(pid int) bool {
	return a != nil && peercred.RunsOneOf(a.cfg.Exe, pid, a.cfg.Exes)
}

// Attest checks that pid, a trusted Codex process, writes thread: it holds the thread's
// writer lock and its rollout open under one configured home, and the rollout's header names
// the thread. thread must already be validated (ValidID).
func (a *Attester) Attest(pid int, thread string) (Lease, error) {
	if a == nil {
		return Lease{}, fmt.Errorf("codex: not configured")
	}
	if _, err := ValidID(thread); err != nil {
		return Lease{}, fmt.Errorf("codex: thread id: %w", err)
	}
	files, err := a.cfg.Files(pid)
	if err != nil {
		return Lease{}, fmt.Errorf("codex: open files of pid %d: %w", pid, err)
	}
	var last error = fmt.Errorf("codex: pid %d holds no writer lock of thread %s", pid, thread)
	for _, h := range a.cfg.Homes {
		home, err := peercred.Canonical(h)
		if err != nil {
			continue
		}
		lease, err := attestHome(home, pid, thread, files)
		if err == nil {
			return lease, nil
		}
		last = err
	}
	return Lease{}, last
}

func attestHome(home string, pid int, thread string, files []peercred.OpenFile) (Lease, error) {
	lockRel := filepath.Join("thread-writer-locks", thread+".lock")
	lock, err := statBeneath(home, lockRel)
	if err != nil {
		return Lease{}, fmt.Errorf("codex: writer lock: %w", err)
	}
	if _, ok := peercred.HoldsOpen(files, lock.Dev, lock.Ino); !ok {
		return Lease{}, fmt.Errorf("codex: pid %d does not hold the writer lock of thread %s", pid, thread)
	}
	// The rollout is the file the process itself writes: found among its descriptors, then
	// opened again beneath the home and required to be that same file.
	prefix := filepath.Join(home, "sessions") + "/"
	suffix := "-" + thread + ".jsonl"
	for _, f := range files {
		if !strings.HasPrefix(f.Path, prefix) || !strings.HasSuffix(f.Path, suffix) || !strings.HasPrefix(filepath.Base(f.Path), "rollout-") {
			continue
		}
		rel := strings.TrimPrefix(f.Path, home+"/")
		if filepath.Clean(rel) != rel || strings.Contains(rel, "..") {
			continue
		}
		h, st, err := readHeaderBeneath(home, rel)
		if err != nil {
			return Lease{}, err
		}
		if st.Dev != f.Dev || st.Ino != f.Ino {
			return Lease{}, fmt.Errorf("codex: rollout of thread %s is not the file pid %d writes", thread, pid)
		}
		if h.ID != thread {
			return Lease{}, fmt.Errorf("codex: rollout header names thread %s, not %s", h.ID, thread)
		}
		return Lease{Thread: thread, PID: pid, Lock: filepath.Join(home, lockRel), Cwd: h.Cwd}, nil
	}
	return Lease{}, fmt.Errorf("codex: pid %d holds no rollout of thread %s", pid, thread)
}

// LockDir is the directory a lease's lock lives in (what the lock watch follows).
func LockDir(lock string) string { return filepath.Dir(lock) }
