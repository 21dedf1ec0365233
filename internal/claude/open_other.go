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
// It never reports a file as unchanged (the zero key is never cached).
func readSessionFile(dir, name string, uid int, _ func(fileKey) bool) ([]byte, fileKey, error) {
	p := filepath.Join(dir, name)
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, fileKey{}, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fileKey{}, errors.New("not a regular file")
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fileKey{}, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if len(raw) > maxFileSize {
		return nil, fileKey{}, errors.New("too large")
	}
	return raw, fileKey{}, err
}
