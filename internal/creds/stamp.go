package creds

import (
	"os"
	"path/filepath"
	"time"
)

// Stamp identifies one version of a file by what stat(2) says of it: a reloader compares
// stamps and reads nothing while they are equal. It is no check of the file (Read makes
// those); only "has this changed?".
type Stamp struct {
	Dev, Ino     uint64
	Size         int64
	Mtime, Ctime int64 // nanoseconds
}

// StampOf stamps the file Read(name, fallbackPath) would read, following the kubelet's
// links as Read does; the zero Stamp when there is none. Errors other than absence come
// back (a reloader then reads, and Read reports).
func StampOf(name, fallbackPath string) (Stamp, error) {
	path := fallbackPath
	if dir := Dir(); dir != "" && checkName(name) == nil {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			path = filepath.Join(dir, name)
		}
	}
	if path == "" {
		return Stamp{}, nil
	}
	return StampPath(path)
}

// StampPath stamps path (symlinks followed).
func StampPath(path string) (Stamp, error) {
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return Stamp{}, nil
	}
	if err != nil {
		return Stamp{}, err
	}
	return stampOf(fi), nil
}

// Racy reports whether s may hide a change made in the same clock tick as the stamp taken at
// at: a file written within a second or two of being stamped could be written again with
// the same size and times, so it is read once more before its stamp is trusted (git's
// "racily clean" rule).
func (s Stamp) Racy(at time.Time) bool {
	t := max(s.Mtime, s.Ctime)
	return at.UnixNano()-t < int64(2*time.Second)
}
