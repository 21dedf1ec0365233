// Package creds reads the daemon's credentials (docs/design.md §5): the federation certificate,
// key, CA and the peers file.
//
// Under systemd they come from $CREDENTIALS_DIRECTORY/<name> (LoadCredential=); otherwise a
// flag names a plain file. Secrets never travel in argv or the environment, are read once
// before the sandbox narrows the filesystem, and never appear in an error or a log line:
// errors name the credential only.
//
// A credential file is refused unless nobody but its owner and this process can read it:
//
//   - it is opened with O_NOFOLLOW, so a symlink is refused, and every check is made on the
//     opened file (fstat, fgetxattr), so it cannot be swapped between check and read;
//   - it must be a regular file (O_NONBLOCK keeps a FIFO from blocking the open);
//   - it must be owned by this process's uid or by root: whoever owns it can rewrite it;
//   - without an ACL its mode must grant nothing to group or others (mode & 0077 == 0);
//   - with a POSIX ACL, the group bits of the mode are the ACL mask, so the ACL itself is
//     checked: nothing for others, the owning group or any named group, and no named user
//     but this process's uid. This is the shape systemd ≥ 255 delivers on tmpfs (root-owned,
//     mode 0440, user:<service uid>:r--); systemd 252 on ramfs delivers 0400 files owned
//     by the service user instead. Both are accepted; a file readable by anyone else is not;
//   - it must be at most MaxSize bytes (or the bound its reader gives, ReadMax), checked
//     before and while reading.
//
// One shape more is accepted, in $CREDENTIALS_DIRECTORY and for a plain path alike: a
// Kubernetes Secret volume (the kubelet's links through ..data, resolved beneath the
// directory holding the link; group-readable for the process's own group), where a daemon in
// a pod finds its credentials (kube.go).
package creds

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// MaxSize is the largest credential accepted: certificates, keys and the peers file are
// far smaller, so anything bigger is a mistake or an attack on memory.
const MaxSize = 1 << 20

// Source says where a credential came from.
type Source string

// The three sources.
const (
	SourceCredentialsDirectory Source = "credentials-directory" // $CREDENTIALS_DIRECTORY/<name>
	SourcePath                 Source = "path"                  // a plain file named by a flag
	SourceNone                 Source = "none"                  // not configured
)

// Dir returns $CREDENTIALS_DIRECTORY, or "" when systemd passed none.
func Dir() string { return os.Getenv("CREDENTIALS_DIRECTORY") }

// Read returns the named credential and where it came from:
//
//   - $CREDENTIALS_DIRECTORY/<name> when that variable is set and the file exists;
//   - else fallbackPath, when given (a missing file there is an error: it was named);
//   - else (nil, SourceNone, nil): the credential is not configured.
//
// A file that exists but fails a check (see the package documentation) is an error; it
// never falls through to the next source. Errors name the credential, never its content.
func Read(name, fallbackPath string) ([]byte, Source, error) {
	return ReadMax(name, fallbackPath, MaxSize)
}

// ReadMax is Read with a bound of its own instead of MaxSize: a credential that grows with
// what it describes (the peers file of a hub, one entry per leaf).
func ReadMax(name, fallbackPath string, max int) ([]byte, Source, error) {
	if err := checkName(name); err != nil {
		return nil, SourceNone, err
	}
	if dir := Dir(); dir != "" {
		b, err := readCredential(dir, name, max)
		if err == nil {
			return b, SourceCredentialsDirectory, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, SourceCredentialsDirectory, err
		}
		// Not delivered by systemd: an optional credential, or one given by flag.
	}
	if fallbackPath != "" {
		b, err := readFile(name, fallbackPath, max)
		if err != nil {
			return nil, SourcePath, err
		}
		return b, SourcePath, nil
	}
	return nil, SourceNone, nil
}

// checkName refuses names that would leave $CREDENTIALS_DIRECTORY.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("creds: invalid credential name %q", name)
	}
	return nil
}

// readCredential reads $CREDENTIALS_DIRECTORY/name: a plain file as readFile does, or the
// kubelet's Secret layout (kube.go), whose symlinks are resolved beneath dir only.
func readCredential(dir, name string, max int) ([]byte, error) {
	path := filepath.Join(dir, name)
	if !kubeLayout(dir, name) {
		return readFile(name, path, max)
	}
	f, err := openBeneath(dir, name)
	if err != nil {
		return nil, fmt.Errorf("creds: %s: open: %w", name, err)
	}
	defer f.Close()
	return readOpened(name, path, f, true, max)
}

// readFile opens path without following a symlink, checks the opened file and reads it.
// The one symlink taken is the kubelet's Secret layout (kube.go), resolved beneath the
// file's own directory: a pod mounts its Secret at a path its flags name.
func readFile(name, path string, max int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if errors.Is(err, syscall.ELOOP) {
		dir, base := filepath.Dir(path), filepath.Base(path)
		if !kubeLayout(dir, base) {
			return nil, fmt.Errorf("creds: %s: %s is a symlink (refused)", name, path)
		}
		if f, err = openBeneath(dir, base); err != nil {
			return nil, fmt.Errorf("creds: %s: open: %w", name, err)
		}
		defer f.Close()
		return readOpened(name, path, f, true, max)
	}
	if err != nil {
		return nil, fmt.Errorf("creds: %s: open: %w", name, err)
	}
	defer f.Close()
	return readOpened(name, path, f, false, max)
}

// readOpened checks the opened file and reads it; ownGroupRead lets the file's group read it
// when that group is this process's own (the kubelet's fsGroup; kube.go).
func readOpened(name, path string, f *os.File, ownGroupRead bool, max int) ([]byte, error) {

	fi, err := f.Stat() // fstat of the opened file: what we check is what we read
	if err != nil {
		return nil, fmt.Errorf("creds: %s: stat: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("creds: %s: %s is not a regular file (%s)", name, path, fi.Mode().Type())
	}
	if err := checkAccess(f, fi, ownGroupRead); err != nil {
		return nil, fmt.Errorf("creds: %s: %s %w", name, path, err)
	}
	if fi.Size() > int64(max) {
		return nil, tooLarge(name, path, max)
	}
	// Read at most one byte more than allowed, in case the file grew after the fstat, into
	// one buffer sized by the fstat: a buffer grown while reading would leave partial copies
	// of the secret behind as garbage (custody zeroes the one buffer it is given).
	var buf bytes.Buffer
	buf.Grow(int(fi.Size()) + bytes.MinRead)
	if _, err := buf.ReadFrom(io.LimitReader(f, int64(max)+1)); err != nil {
		return nil, fmt.Errorf("creds: %s: read: %w", name, err)
	}
	b := buf.Bytes()
	if len(b) > max {
		return nil, tooLarge(name, path, max)
	}
	return b, nil
}

// tooLarge is the error of a credential over its bound, which it names.
func tooLarge(name, path string, max int) error {
	return fmt.Errorf("creds: %s: %s is larger than %d bytes (%d MiB), the most the %s credential may hold", name, path, max, max>>20, name)
}

// checkAccess refuses a file that anyone but its owner and this process could read or
// that someone else owns. The returned error reads after the path ("... is owned by ...").
func checkAccess(f *os.File, fi os.FileInfo, ownGroupRead bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("has no ownership information (refused)")
	}
	euid := uint32(os.Geteuid())
	if st.Uid != euid && st.Uid != 0 {
		return fmt.Errorf("is owned by uid %d, neither this process (uid %d) nor root", st.Uid, euid)
	}
	perm := uint32(fi.Mode().Perm())
	acl, err := accessACL(f)
	if err != nil {
		return fmt.Errorf("acl: %w", err)
	}
	if acl == nil {
		if ownGroupRead && perm&0o037 == 0 && ownGroup(st.Gid) {
			// Read for the group, nothing else, and the group is ours (kube.go).
			return nil
		}
		if perm&0o077 != 0 {
			return fmt.Errorf("is accessible by group or others (mode %04o, want no bits in 0077)", perm)
		}
		return nil
	}
	entries, err := parseACL(acl)
	if err != nil {
		return fmt.Errorf("acl: %w", err)
	}
	return checkACL(entries, euid)
}
