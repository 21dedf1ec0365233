package codex

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/safeopen"
)

// Config of an Attester.
type Config struct {
	Exes  []string // trusted Codex executables (`--codex-exe`)
	Homes []string // Codex homes (`--codex-home`), absolute
	// Exe and Files read another process's /proc/<pid>/exe and /proc/<pid>/fd; a sandboxed
	// daemon passes the exehelper's.
	Exe   func(pid int) (string, error)
	Files func(pid int) ([]peercred.OpenFile, error)
	// ExeDigest reads pid's canonical executable and the SHA-256 of the running file
	// (peercred.Proc.ExeDigest, or the exehelper's); nil: no copy is ever attested.
	ExeDigest func(pid int) (path, sum string, err error)
	// FileDigest is the SHA-256 of a trusted executable, read now; nil reads the file here.
	FileDigest func(path string) (string, error)
	// Locks reads /proc/locks (Threads); nil: threads are found only by their calls.
	Locks func() ([]peercred.Lock, error)
}

// Attester checks Codex sessions. Safe for concurrent use.
type Attester struct {
	cfg     Config
	digests peercred.Digests
}

// New returns an attester, or nil when no Codex executable or home is configured (then no
// process is ever a Codex session).
func New(cfg Config) *Attester {
	if len(cfg.Exes) == 0 || len(cfg.Homes) == 0 {
		return nil
	}
	a := &Attester{cfg: cfg}
	if a.cfg.FileDigest == nil {
		a.cfg.FileDigest = a.digests.File
	}
	return a
}

// Lease is an attested thread: the process that writes it, and the lock whose removal ends it.
type Lease struct {
	Thread string // thread id (lowercase UUID)
	PID    int    // the trusted Codex process holding the lock
	Lock   string // canonical path of the lock file
	Cwd    string // from the rollout header
}

// IsCodex reports whether pid runs a trusted Codex executable: one of `--codex-exe`, or a
// copy of one that Codex manages under a Codex home. Both sides are canonicalized now, as for
// services: a re-pointed symlink or a deleted binary fails.
//
// A copy is what Codex's shared app-server daemon runs: the TUI copies its own binary to
// <home>/packages/app-server-daemon/releases/<version>/bin/codex and starts the daemon from
// there, a path that changes with every version. It is attested by what it is: an executable
// beneath a configured home whose content, read through the running file itself, has the
// SHA-256 of a trusted executable read now. A copy that differs by a byte, lies outside every
// home, or was deleted or replaced since it started is refused.
func (a *Attester) IsCodex(pid int) bool {
	if a == nil {
		return false
	}
	path, err := a.cfg.Exe(pid)
	if err != nil {
		return false
	}
	for _, t := range a.cfg.Exes {
		if want, err := peercred.Canonical(t); err == nil && want == path {
			return true
		}
	}
	return a.isCopy(pid, path)
}

// isCopy reports whether pid, running the executable at path, runs a copy of a trusted Codex
// executable under a Codex home (IsCodex).
func (a *Attester) isCopy(pid int, path string) bool {
	if a.cfg.ExeDigest == nil || !a.underHome(path) {
		return false
	}
	got, sum, err := a.cfg.ExeDigest(pid)
	if err != nil || got != path || sum == "" {
		return false
	}
	for _, t := range a.cfg.Exes {
		want, err := a.cfg.FileDigest(t)
		if err == nil && want == sum {
			return true
		}
	}
	return false
}

// underHome reports whether path lies beneath one of the configured homes (canonical now).
func (a *Attester) underHome(path string) bool {
	for _, h := range a.cfg.Homes {
		home, err := peercred.Canonical(h)
		if err == nil && strings.HasPrefix(path, home+"/") {
			return true
		}
	}
	return false
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

// MaxThreads bounds how many lock files Threads reads per home.
const MaxThreads = 1024

// Threads lists the threads a trusted Codex process is writing now, before any of them has
// called an xmsg tool: for each writer lock under a configured home, the process the kernel
// shows holding it (/proc/locks) must be a trusted Codex process (IsCodex) and pass Attest
// for that thread (it holds the lock and the rollout open, whose header names the thread).
// skip reports a thread already known, which is not attested again.
func (a *Attester) Threads(skip func(thread string) bool) []Lease {
	if a == nil || a.cfg.Locks == nil {
		return nil
	}
	var locks []peercred.Lock
	var out []Lease
	for _, h := range a.cfg.Homes {
		home, err := peercred.Canonical(h)
		if err != nil {
			continue
		}
		d, err := os.Open(filepath.Join(home, "thread-writer-locks"))
		if err != nil {
			continue
		}
		names, _ := d.Readdirnames(MaxThreads)
		d.Close()
		for _, n := range names {
			thread, err := ValidID(strings.TrimSuffix(n, ".lock"))
			if err != nil || n != thread+".lock" || skip(thread) {
				continue
			}
			id, err := statBeneath(home, filepath.Join("thread-writer-locks", n))
			if err != nil {
				continue
			}
			if locks == nil {
				if locks, err = a.cfg.Locks(); err != nil {
					return out
				}
			}
			for _, pid := range holders(locks, id) {
				if !a.IsCodex(pid) {
					continue
				}
				if lease, err := a.Attest(pid, thread); err == nil {
					out = append(out, lease)
					break
				}
			}
		}
	}
	return out
}

// holders are the pids /proc/locks shows holding an exclusive lock on the file id.
func holders(locks []peercred.Lock, id safeopen.ID) []int {
	var pids []int
	for _, l := range locks {
		if (l.Kind == "FLOCK" || l.Kind == "POSIX") && l.Exclusive && l.PID > 0 &&
			l.Major == id.Major() && l.Minor == id.Minor() && l.Ino == id.Ino {
			pids = append(pids, l.PID)
		}
	}
	return pids
}
