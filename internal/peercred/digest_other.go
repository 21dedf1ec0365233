//go:build !linux

package peercred

import (
	"errors"
	"os"
)

// Digests is not implemented off Linux: every attestation that needs it fails closed.
type Digests struct{}

var errDigest = errors.New("peercred: executable digests are only read on linux")

// Of fails off Linux.
func (d *Digests) Of(f *os.File) (string, error) { return "", errDigest }

// File fails off Linux.
func (d *Digests) File(path string) (string, error) { return "", errDigest }

// ExeDigest fails off Linux.
func (p Proc) ExeDigest(pid int, d *Digests) (string, string, error) { return "", "", errDigest }
