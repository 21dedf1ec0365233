//go:build linux

package peercred

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// Digests computes the SHA-256 of open files, remembering each by what fstat says of the
// file itself (device, inode, size, modification and change times): a file written since
// has another change time, which no process can set back, so a remembered digest is the
// content's. Safe for concurrent use; it holds at most maxDigests entries.
type Digests struct {
	mu sync.Mutex
	m  map[digestKey]string
}

const maxDigests = 64

type digestKey struct {
	dev, ino, size                 uint64
	mtimeS, mtimeN, ctimeS, ctimeN int64
}

// Of returns the hex SHA-256 of the content of f, an open regular file, read from the
// start through f itself (never a path looked up again).
func (d *Digests) Of(f *os.File) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return "", fmt.Errorf("peercred: fstat: %w", err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return "", fmt.Errorf("peercred: %s is not a regular file", f.Name())
	}
	k := keyOf(&st)
	d.mu.Lock()
	sum, ok := d.m[k]
	d.mu.Unlock()
	if ok {
		return sum, nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, int64(st.Size))); err != nil {
		return "", fmt.Errorf("peercred: read %s: %w", f.Name(), err)
	}
	// Written while it was read: the digest is of no one version; fail closed.
	var after syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &after); err != nil || keyOf(&after) != k {
		return "", fmt.Errorf("peercred: %s changed while it was read", f.Name())
	}
	sum = hex.EncodeToString(h.Sum(nil))
	d.mu.Lock()
	if d.m == nil || len(d.m) >= maxDigests {
		d.m = map[digestKey]string{}
	}
	d.m[k] = sum
	d.mu.Unlock()
	return sum, nil
}

// File returns the digest of the file at path (symlinks followed).
func (d *Digests) File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("peercred: open: %w", err)
	}
	defer f.Close()
	return d.Of(f)
}
