//go:build !linux

// Package safeopen opens files of harness state beneath a fixed root (Linux only).
package safeopen

import (
	"errors"
	"os"
)

// ID is a regular file's device and inode.
type ID struct{ Dev, Ino uint64 }

// Major is unavailable off Linux.
func (id ID) Major() uint32 { return 0 }

// Minor is unavailable off Linux.
func (id ID) Minor() uint32 { return 0 }

var errUnsupported = errors.New("safeopen: only supported on linux")

// Open fails off Linux.
func Open(root, rel string) (*os.File, ID, error) { return nil, ID{}, errUnsupported }

// Stat fails off Linux.
func Stat(root, rel string) (ID, error) { return ID{}, errUnsupported }
