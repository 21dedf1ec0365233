package agy

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/safeopen"
)

// Config of an Attester.
type Config struct {
	Exes        []string // trusted Antigravity executables (`--agy-exe`)
	PresenceDir string   // where conversations' presence locks live
	// Exe and Files read another process's /proc/<pid>/exe and /proc/<pid>/fd (the
	// exehelper's in a sandboxed daemon); Locks reads /proc/locks.
	Exe   func(pid int) (string, error)
	Files func(pid int) ([]peercred.OpenFile, error)
	Locks func() ([]peercred.Lock, error)
}

// Attester checks agy sessions. Safe for concurrent use.
type Attester struct{ cfg Config }

// New returns an attester, or nil when no executable or presence directory is configured
// (then agy attestation always fails).
func New(cfg Config) *Attester {
	if len(cfg.Exes) == 0 || cfg.PresenceDir == "" {
		return nil
	}
	return &Attester{cfg: cfg}
}

// Presence is an attested conversation: the process holding its presence lock.
type Presence struct {
	Conversation string
	PID          int
	Lock         string // canonical path of the presence lock
	ID           safeopen.ID
}

// IsAgy reports whether pid runs a trusted Antigravity executable.
func (a *Attester) IsAgy(pid int) bool {
	return a != nil && peercred.RunsOneOf(a.cfg.Exe, pid, a.cfg.Exes)
}

// Attest returns the conversation whose presence lock pid (a trusted agy process) holds.
// conversation "" accepts any one conversation; otherwise it must be that one.
func (a *Attester) Attest(pid int, conversation string) (Presence, error) {
	if a == nil {
		return Presence{}, errors.New("agy: not configured")
	}
	dir, err := peercred.Canonical(a.cfg.PresenceDir)
	if err != nil {
		return Presence{}, fmt.Errorf("agy: presence dir: %w", err)
	}
	files, err := a.cfg.Files(pid)
	if err != nil {
		return Presence{}, fmt.Errorf("agy: open files of pid %d: %w", pid, err)
	}
	locks, err := a.cfg.Locks()
	if err != nil {
		return Presence{}, err
	}
	for _, f := range files {
		if filepath.Dir(f.Path) != dir || !strings.HasSuffix(f.Path, ".lock") {
			continue
		}
		conv, err := ValidConversation(strings.TrimSuffix(filepath.Base(f.Path), ".lock"))
		if err != nil || (conversation != "" && conv != conversation) {
			continue
		}
		p, err := a.check(dir, conv, pid, f, locks)
		if err != nil {
			return Presence{}, err
		}
		return p, nil
	}
	if conversation != "" {
		return Presence{}, fmt.Errorf("agy: pid %d holds no presence lock of conversation %s", pid, conversation)
	}
	return Presence{}, fmt.Errorf("agy: pid %d holds no presence lock", pid)
}

func (a *Attester) check(dir, conv string, pid int, f peercred.OpenFile, locks []peercred.Lock) (Presence, error) {
	// The descriptor must be of the file at the lock's path now (same device and inode), and
	// the kernel must show an exclusive flock on it taken by pid itself: an open descriptor of
	// a lock some other process (not this ancestor) flocked proves nothing about this one.
	id, err := safeopen.Stat(dir, conv+".lock")
	if err != nil {
		return Presence{}, fmt.Errorf("agy: presence lock: %w", err)
	}
	if id.Dev != f.Dev || id.Ino != f.Ino {
		return Presence{}, fmt.Errorf("agy: pid %d holds a replaced presence lock of %s", pid, conv)
	}
	if !Flocked(locks, id, pid) {
		return Presence{}, fmt.Errorf("agy: presence lock of %s is not exclusively flocked by pid %d", conv, pid)
	}
	return Presence{Conversation: conv, PID: pid, Lock: filepath.Join(dir, conv+".lock"), ID: id}, nil
}

// Flocked reports whether /proc/locks shows an exclusive FLOCK on the file id taken by pid.
// (A flock stays with the open file description: a holder that forked and exited leaves a
// lock that names a dead pid, and that no longer attests anyone; fail closed.)
func Flocked(locks []peercred.Lock, id safeopen.ID, pid int) bool {
	for _, l := range locks {
		if l.Kind == "FLOCK" && l.Exclusive && l.PID == pid && l.Major == id.Major() && l.Minor == id.Minor() && l.Ino == id.Ino {
			return true
		}
	}
	return false
}

// Held reports whether p's lock is still the same file and still exclusively flocked by
// p.PID (the holder's liveness is checked by the caller).
func (a *Attester) Held(p Presence) bool {
	if a == nil {
		return false
	}
	id, err := safeopen.Stat(filepath.Dir(p.Lock), filepath.Base(p.Lock))
	if err != nil || id != p.ID {
		return false
	}
	locks, err := a.cfg.Locks()
	return err == nil && Flocked(locks, id, p.PID)
}
