//go:build linux

package claude

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// readSessionFile opens dir/name relative to an fd of dir with O_NOFOLLOW, so a symlink is
// refused by the kernel, and O_NONBLOCK, so a FIFO planted under a .json name cannot block the
// scan; fstat on the opened fd then decides (no window between check and use).
//
// unchanged(key) lets the caller skip the read when it already parsed this exact file
// version (same device, inode, size and mtime); then raw is nil.
func readSessionFile(dir, name string, uid int, unchanged func(fileKey) bool) (raw []byte, key fileKey, err error) {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, key, fmt.Errorf("open dir: %w", err)
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, key, errors.New("is a symlink")
	}
	if err != nil {
		return nil, key, fmt.Errorf("openat: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, key, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, key, errors.New("not a regular file")
	}
	if int(st.Uid) != uid {
		return nil, key, fmt.Errorf("owned by uid %d, not %d", st.Uid, uid)
	}
	key = fileKey{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}
	if unchanged(key) {
		return nil, key, nil
	}
	raw, err = io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, key, err
	}
	if len(raw) > maxFileSize {
		return nil, key, errors.New("too large")
	}
	return raw, key, nil
}
