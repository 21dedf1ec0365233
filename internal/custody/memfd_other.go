//go:build !linux

package custody

import (
	"errors"
	"os"
)

// Seals has no meaning without memfds.
const Seals = 0

var errNoMemfd = errors.New("custody needs Linux (sealed memfds)")

func seal(string, []byte) (*os.File, error) { return nil, errNoMemfd }
func reopen(*os.File) (*os.File, error)     { return nil, errNoMemfd }

// CheckSealed always fails off Linux.
func CheckSealed(int) error { return errNoMemfd }
