//go:build linux

// Package safeopen opens files of harness state (Codex writer locks and rollouts,
// Antigravity presence locks) that live in directories other processes of the user write:
// beneath a fixed root, with no symlink on the path, and only regular files of our euid.
package safeopen

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ID is a regular file's device and inode.
type ID struct{ Dev, Ino uint64 }

// Major and Minor split Dev as /proc/locks prints it.
func (id ID) Major() uint32 { return unix.Major(id.Dev) }

// Minor is the minor device number of Dev.
func (id ID) Minor() uint32 { return unix.Minor(id.Dev) }

// Open opens rel inside the directory root without following any symlink on the way
// (RESOLVE_NO_SYMLINKS covers every component, not only the last as O_NOFOLLOW does) and
// without leaving root. O_NONBLOCK keeps a FIFO from blocking the open; the result must then
// be a regular file owned by the daemon's euid: FIFOs, sockets, devices, directories and
// other users' files are refused.
func Open(root, rel string) (*os.File, ID, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, ID{}, fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, ID{}, fmt.Errorf("open %s beneath %s: %w", rel, root, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, ID{}, fmt.Errorf("stat %s: %w", rel, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		unix.Close(fd)
		return nil, ID{}, fmt.Errorf("%s is not a regular file", rel)
	case int(st.Uid) != os.Geteuid():
		unix.Close(fd)
		return nil, ID{}, fmt.Errorf("%s is owned by uid %d, not %d", rel, st.Uid, os.Geteuid())
	}
	return os.NewFile(uintptr(fd), rel), ID{Dev: uint64(st.Dev), Ino: st.Ino}, nil
}

// Stat is Open without keeping the file.
func Stat(root, rel string) (ID, error) {
	f, id, err := Open(root, rel)
	if err != nil {
		return ID{}, err
	}
	f.Close()
	return id, nil
}
