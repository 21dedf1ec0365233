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
func readSessionFile(dir, name string, uid int) ([]byte, error) {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open dir: %w", err)
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, errors.New("is a symlink")
	}
	if err != nil {
		return nil, fmt.Errorf("openat: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errors.New("not a regular file")
	}
	if int(st.Uid) != uid {
		return nil, fmt.Errorf("owned by uid %d, not %d", st.Uid, uid)
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxFileSize {
		return nil, errors.New("too large")
	}
	return raw, nil
}
