//go:build !linux

package peercred

import "errors"

// OpenFiles is not implemented off Linux: every attestation that needs it fails closed.
func (p Proc) OpenFiles(pid int) ([]OpenFile, error) {
	return nil, errors.New("peercred: open files are only readable on linux")
}
