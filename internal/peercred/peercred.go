// Package peercred tells who is on the other end of a Unix socket and which
// process that is: the kernel's SO_PEERCRED credentials of a connection,
// and the /proc facts used for attestation (start time as a pid-reuse guard,
// parent pid for the ancestor walk, the canonical executable path).
//
// It is the only package of xmsg that reads /proc (docs/protocol.md Appendix A).
// Every function fails closed: when a fact cannot be read exactly, the
// caller gets an error (or false), never a guess.
package peercred

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrExited means the process is gone (or its pid now names another process).
var ErrExited = errors.New("peercred: process exited")

// Cred is what the kernel recorded about the peer of a Unix stream socket
// when it connected (SO_PEERCRED). The peer cannot choose these values.
type Cred struct {
	PID      int
	UID, GID uint32
}

// Proc reads process facts from a procfs tree.
type Proc struct {
	// Root is the procfs mount point; "" means "/proc". Tests point it at a
	// fake tree.
	Root string
}

// Stat holds the fields of /proc/<pid>/stat that xmsg uses.
type Stat struct {
	PID  int
	PPID int // field 4
	// StartTime is field 22 (clock ticks since boot) as the kernel printed
	// it. Together with the PID it names one process: a recycled PID gets a
	// different start time. It is kept as a string because it is compared,
	// stored and sent as text (session files carry it as procStart).
	StartTime string
	Comm      string // field 2 without the parentheses (may contain anything but NUL)
}

func (p Proc) root() string {
	if p.Root == "" {
		return "/proc"
	}
	return p.Root
}

func (p Proc) path(pid int, name string) (string, error) {
	// pid 0 and negatives have no /proc entry; refusing them here also keeps
	// the path from ever naming something like /proc/-1.
	if pid <= 0 {
		return "", fmt.Errorf("peercred: invalid pid %d", pid)
	}
	return filepath.Join(p.root(), strconv.Itoa(pid), name), nil
}

// Stat reads and parses /proc/<pid>/stat.
func (p Proc) Stat(pid int) (Stat, error) {
	path, err := p.path(pid, "stat")
	if err != nil {
		return Stat{}, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Stat{}, fmt.Errorf("peercred: read stat: %w", err)
	}
	st, err := parseStat(data)
	if err != nil {
		return Stat{}, fmt.Errorf("peercred: parse %s: %w", path, err)
	}
	if st.PID != pid {
		return Stat{}, fmt.Errorf("peercred: parse %s: pid field %d, want %d", path, st.PID, pid)
	}
	return st, nil
}

// parseStat parses the text of a /proc/<pid>/stat file. The comm field is
// the one field the process controls (prctl PR_SET_NAME, or the name of its
// executable) and may contain spaces and ')', so the fixed fields are taken
// after the LAST ')'.
func parseStat(data []byte) (Stat, error) {
	open := bytes.IndexByte(data, '(')
	closing := bytes.LastIndexByte(data, ')')
	if open < 0 || closing < open {
		return Stat{}, errors.New("no comm field")
	}
	pid, err := decimal(strings.TrimSpace(string(data[:open])))
	if err != nil {
		return Stat{}, fmt.Errorf("pid field: %w", err)
	}
	// fields[0] is field 3 (state), so field n is fields[n-3].
	fields := strings.Fields(string(data[closing+1:]))
	if len(fields) < 22-3+1 {
		return Stat{}, fmt.Errorf("%d fields after comm, want at least %d", len(fields), 22-3+1)
	}
	ppid, err := decimal(fields[4-3])
	if err != nil {
		return Stat{}, fmt.Errorf("ppid field: %w", err)
	}
	start := fields[22-3]
	if _, err := strconv.ParseUint(start, 10, 64); err != nil || start[0] == '+' {
		return Stat{}, fmt.Errorf("starttime field %q is not a decimal number", start)
	}
	return Stat{PID: pid, PPID: ppid, StartTime: start, Comm: string(data[open+1 : closing])}, nil
}

// decimal parses a non-negative decimal int with no sign.
func decimal(s string) (int, error) {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, fmt.Errorf("%q is not a decimal number", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a decimal number", s)
	}
	return n, nil
}

// CPUTime returns the user plus system CPU time pid has used (fields 14 and 15 of
// /proc/<pid>/stat, in USER_HZ, which Linux fixes at 100 per second for /proc).
func (p Proc) CPUTime(pid int) (time.Duration, error) {
	path, err := p.path(pid, "stat")
	if err != nil {
		return 0, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("peercred: read stat: %w", err)
	}
	closing := bytes.LastIndexByte(data, ')')
	if closing < 0 {
		return 0, errors.New("peercred: no comm field")
	}
	fields := strings.Fields(string(data[closing+1:]))
	if len(fields) < 15-3+1 {
		return 0, errors.New("peercred: short stat")
	}
	ut, err1 := strconv.ParseUint(fields[14-3], 10, 64)
	st, err2 := strconv.ParseUint(fields[15-3], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("peercred: bad cpu time fields")
	}
	return time.Duration(ut+st) * (time.Second / 100), nil
}

// StartTime returns field 22 of /proc/<pid>/stat.
func (p Proc) StartTime(pid int) (string, error) {
	st, err := p.Stat(pid)
	if err != nil {
		return "", err
	}
	return st.StartTime, nil
}

// Alive reports whether pid is running and is the same process that had
// start time start: true iff its stat is readable and its start time equals
// start. An empty start never matches, so a record without a start time
// cannot be mistaken for a live process.
func (p Proc) Alive(pid int, start string) bool {
	if start == "" {
		return false
	}
	st, err := p.Stat(pid)
	return err == nil && st.StartTime == start
}

// Exe returns the canonical path of the executable that pid runs.
//
// The kernel appends " (deleted)" to the link when the file was unlinked (or
// replaced by a rename) after exec; the path then names some other file or
// none, so that is an error. After canonicalizing, the file at the path must
// still be the very file the process runs (same device and inode): this
// catches a file replaced or mounted over at that path, where the link text
// alone would still look right.
func (p Proc) Exe(pid int) (string, error) {
	link, err := p.path(pid, "exe")
	if err != nil {
		return "", err
	}
	target, err := os.Readlink(link)
	if err != nil {
		return "", fmt.Errorf("peercred: readlink exe: %w", err)
	}
	if strings.HasSuffix(target, " (deleted)") {
		return "", fmt.Errorf("peercred: exe of pid %d was deleted", pid)
	}
	canonical, err := Canonical(target)
	if err != nil {
		return "", err
	}
	running, err := os.Stat(link) // follows the magic link to the running file
	if err != nil {
		return "", fmt.Errorf("peercred: stat exe: %w", err)
	}
	onDisk, err := os.Stat(canonical)
	if err != nil {
		return "", fmt.Errorf("peercred: stat exe path: %w", err)
	}
	if !os.SameFile(running, onDisk) {
		return "", fmt.Errorf("peercred: exe of pid %d is no longer the file at %s", pid, canonical)
	}
	return canonical, nil
}

// Ancestors returns the stat of pid followed by those of its parent,
// grandparent and so on. The walk stops after max entries (at least one),
// after an entry whose PPID is 0 or 1 (that entry included), or when a
// parent cannot be read. Only a failure to read pid itself is an error.
//
// A parent that started after its child cannot be its parent: the real
// parent exited and its PID was reused between the two reads. The walk
// stops there rather than attribute the child to an unrelated process.
func (p Proc) Ancestors(pid, max int) ([]Stat, error) {
	st, err := p.Stat(pid)
	if err != nil {
		return nil, err
	}
	if max < 1 {
		max = 1
	}
	chain := []Stat{st}
	for len(chain) < max && st.PPID > 1 {
		parent, err := p.Stat(st.PPID)
		if err != nil || startedAfter(parent, st) {
			break
		}
		chain = append(chain, parent)
		st = parent
	}
	return chain, nil
}

// startedAfter reports whether a started later than b. Unparsable values
// (impossible after parseStat) count as later, failing closed.
func startedAfter(a, b Stat) bool {
	x, err1 := strconv.ParseUint(a.StartTime, 10, 64)
	y, err2 := strconv.ParseUint(b.StartTime, 10, 64)
	return err1 != nil || err2 != nil || x > y
}

// Canonical returns the absolute path of path with every symlink resolved.
func Canonical(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("peercred: abs: %w", err)
	}
	resolved, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("peercred: eval symlinks: %w", err)
	}
	return resolved, nil
}

// BootID returns the kernel's boot id (/proc/sys/kernel/random/boot_id). Start times count
// clock ticks since boot, so a pid and start time name one process only within one boot:
// anything keyed by them across a daemon restart must carry the boot id too.
func (p Proc) BootID() (string, error) {
	data, err := os.ReadFile(filepath.Join(p.root(), "sys", "kernel", "random", "boot_id"))
	if err != nil {
		return "", fmt.Errorf("peercred: read boot id: %w", err)
	}
	id := strings.TrimSpace(string(data))
	if id == "" {
		return "", errors.New("peercred: empty boot id")
	}
	return id, nil
}

// RunsOneOf reports whether pid runs one of the trusted executables, comparing canonical
// paths as they are now on both sides: a re-pointed symlink, a replaced or a deleted binary
// does not match. exe is how pid's executable is read (Proc.Exe, or the exe helper under
// Landlock).
func RunsOneOf(exe func(pid int) (string, error), pid int, trusted []string) bool {
	got, err := exe(pid)
	if err != nil {
		return false
	}
	for _, t := range trusted {
		if want, err := Canonical(t); err == nil && want == got {
			return true
		}
	}
	return false
}
