//go:build !linux

package creds

import (
	"errors"
	"os"
)

// openBeneath needs openat2 (Linux): elsewhere a symlinked credential stays refused.
func openBeneath(dir, name string) (*os.File, error) {
	return nil, errors.New("symlinked credentials are only read on Linux")
}
