//go:build linux

package custody

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Seals set on every secret's memfd: its content can never change again (no write, no
// truncate, no growth) and no seal can be added or removed (F_SEAL_SEAL). They hold for
// every open file and mapping of the inode, the recipients' included.
const Seals = unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL

// seal copies b into a new memfd (close-on-exec) and seals it.
func seal(name string, b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("xmsg-custody-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	for off := 0; off < len(b); {
		n, err := unix.Pwrite(fd, b[off:], int64(off))
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("memfd write: %w", err)
		}
		off += n
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, Seals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("memfd seal: %w", err)
	}
	return os.NewFile(uintptr(fd), "memfd:custody"), nil
}

// reopen opens the memfd again, read-only and close-on-exec: a new open file description, so
// each recipient has its own offset (an fd passed as it is would share one with every other
// recipient) and no write access even before the seals are consulted.
func reopen(f *os.File) (*os.File, error) {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("reopen memfd: %w", err)
	}
	if err := CheckSealed(fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "memfd:custody"), nil
}

// CheckSealed reports whether fd is a memfd carrying every seal of Seals (a recipient can
// check what it was handed).
func CheckSealed(fd int) error {
	got, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("custody: get seals: %w", err)
	}
	if got&Seals != Seals {
		return fmt.Errorf("custody: memfd seals %#x, want %#x", got, Seals)
	}
	return nil
}
