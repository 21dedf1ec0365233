//go:build linux

package creds

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openBeneath opens name beneath dir, following symlinks only while they stay beneath it
// (no absolute link, no ".." out of it, no /proc magic links): the kubelet's links are
// relative, inside the volume.
func openBeneath(dir, name string) (*os.File, error) {
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	fd, err := unix.Openat2(int(d.Fd()), name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, fmt.Errorf("openat2 beneath %s: %w", dir, err)
	}
	return os.NewFile(uintptr(fd), dir+"/"+name), nil
}
