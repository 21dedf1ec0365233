//go:build linux

package peercred

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// OpenFiles lists the descriptors pid holds open, with the device and inode of each open
// file (what the descriptor refers to, however it was reached). Reading another process's
// descriptors is a ptrace-mode access: a Landlock-confined daemon asks the exehelper instead.
// Descriptors that close while being read are skipped.
func (p Proc) OpenFiles(pid int) ([]OpenFile, error) {
	dir, err := p.path(pid, "fd")
	if err != nil {
		return nil, err
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("peercred: open fd dir: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(MaxOpenFiles + 1)
	if err != nil && len(names) == 0 {
		return nil, fmt.Errorf("peercred: read fd dir: %w", err)
	}
	if len(names) > MaxOpenFiles {
		return nil, fmt.Errorf("peercred: pid %d holds more than %d descriptors", pid, MaxOpenFiles)
	}
	out := make([]OpenFile, 0, len(names))
	for _, n := range names {
		fd, err := decimal(n)
		if err != nil {
			continue
		}
		link := filepath.Join(dir, n)
		target, err := os.Readlink(link)
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(link, &st); err != nil { // follows the magic link to the open file
			continue
		}
		out = append(out, OpenFile{FD: fd, Path: target, Dev: uint64(st.Dev), Ino: st.Ino})
	}
	return out, nil
}
