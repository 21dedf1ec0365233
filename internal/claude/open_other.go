//go:build !linux

package claude

import (
	"errors"
	"io"
	"os"
	"path/filepath"
)

// readSessionFile is the portable fallback: Lstat refuses symlinks and non-regular files. It
// has a check-then-open window that the Linux openat version does not have.
func readSessionFile(dir, name string, uid int) ([]byte, error) {
	p := filepath.Join(dir, name)
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if len(raw) > maxFileSize {
		return nil, errors.New("too large")
	}
	return raw, err
}
