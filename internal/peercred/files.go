package peercred

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MaxOpenFiles bounds how many descriptors OpenFiles reports: a process holding more is
// refused rather than read without end.
const MaxOpenFiles = 1 << 16

// OpenFile is one descriptor a process holds open.
type OpenFile struct {
	FD   int    `json:"fd"`
	Path string `json:"path"` // the link text of /proc/<pid>/fd/<fd> (may end in " (deleted)")
	Dev  uint64 `json:"dev"`  // device and inode of the open file itself, not of any path
	Ino  uint64 `json:"ino"`
}

// HoldsOpen reports whether pid holds a descriptor of the file with device dev and inode ino.
func HoldsOpen(files []OpenFile, dev, ino uint64) (OpenFile, bool) {
	for _, f := range files {
		if f.Dev == dev && f.Ino == ino {
			return f, true
		}
	}
	return OpenFile{}, false
}

// Lock is one entry of /proc/locks.
type Lock struct {
	Kind      string // FLOCK, POSIX, OFDLCK, LEASE
	Mode      string // ADVISORY, MANDATORY
	Access    string // WRITE (exclusive), READ (shared)
	PID       int    // the process that took the lock (for FLOCK: which may have forked since)
	Major     uint32
	Minor     uint32
	Ino       uint64
	Exclusive bool // Access == WRITE
}

// ParseLocks parses the text of /proc/locks. Lines that do not parse (blocked waiters, marked
// "->", and anything unexpected) are skipped: they never make a lock appear.
func ParseLocks(data []byte) []Lock {
	var out []Lock
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		// "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
		if len(f) < 6 || !strings.HasSuffix(f[0], ":") || f[1] == "->" {
			continue
		}
		pid, err := decimal(f[4])
		if err != nil {
			continue
		}
		parts := strings.Split(f[5], ":")
		if len(parts) != 3 {
			continue
		}
		major, err1 := strconv.ParseUint(parts[0], 16, 32)
		minor, err2 := strconv.ParseUint(parts[1], 16, 32)
		ino, err3 := strconv.ParseUint(parts[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		out = append(out, Lock{Kind: f[1], Mode: f[2], Access: f[3], PID: pid, Major: uint32(major), Minor: uint32(minor), Ino: ino, Exclusive: f[3] == "WRITE"})
	}
	return out
}

// Locks reads and parses /proc/locks.
func (p Proc) Locks() ([]Lock, error) {
	data, err := os.ReadFile(filepath.Join(p.root(), "locks"))
	if err != nil {
		return nil, fmt.Errorf("peercred: read locks: %w", err)
	}
	return ParseLocks(data), nil
}
