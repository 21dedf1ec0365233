//go:build unix

package fed

import "syscall"

// descriptorLimit is the soft RLIMIT_NOFILE (the Go runtime raised it to the hard limit at
// start); 0 when unknown.
func descriptorLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return uint64(r.Cur)
}
