//go:build linux

package creds

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// accessACL returns the file's system.posix_acl_access value, or nil when it has none
// (or its filesystem has no ACLs, as ramfs).
func accessACL(f *os.File) ([]byte, error) {
	fd := int(f.Fd())
	buf := make([]byte, 256)
	for {
		n, err := unix.Fgetxattr(fd, "system.posix_acl_access", buf)
		switch {
		case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP):
			return nil, nil
		case errors.Is(err, unix.ERANGE) && len(buf) < 1<<16:
			buf = make([]byte, 2*len(buf))
			continue
		case err != nil:
			return nil, err
		}
		return buf[:n], nil
	}
}
