//go:build linux

package peercred

import (
	"fmt"
	"os"
	"syscall"
)

func keyOf(st *syscall.Stat_t) digestKey {
	return digestKey{dev: uint64(st.Dev), ino: st.Ino, size: uint64(st.Size),
		mtimeS: st.Mtim.Sec, mtimeN: st.Mtim.Nsec, ctimeS: st.Ctim.Sec, ctimeN: st.Ctim.Nsec}
}

// ExeDigest returns the canonical path of the executable pid runs (as Exe) and the SHA-256
// of the running file's content, read through /proc/<pid>/exe opened (the very file the
// process runs, not a path resolved again). A deleted executable, or one whose path now
// names another file, is an error: the content must be that of the file at the path.
func (p Proc) ExeDigest(pid int, d *Digests) (string, string, error) {
	path, err := p.Exe(pid)
	if err != nil {
		return "", "", err
	}
	link, _ := p.path(pid, "exe")
	f, err := os.Open(link)
	if err != nil {
		return "", "", fmt.Errorf("peercred: open exe: %w", err)
	}
	defer f.Close()
	running, err := f.Stat()
	if err != nil {
		return "", "", fmt.Errorf("peercred: stat exe: %w", err)
	}
	onDisk, err := os.Stat(path)
	if err != nil || !os.SameFile(running, onDisk) {
		return "", "", fmt.Errorf("peercred: exe of pid %d is no longer the file at %s", pid, path)
	}
	sum, err := d.Of(f)
	if err != nil {
		return "", "", err
	}
	return path, sum, nil
}
