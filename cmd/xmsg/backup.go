package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"

	"github.com/xmsg/xmsg/internal/store"
)

// backupFlags is `xmsg backup FILE`: a consistent copy of the running daemon's store, taken
// while it serves (POST /v1/admin/backup, docs/protocol.md §3.12), written 0600 to a temporary
// file beside FILE, fsynced, checked as Open checks a store, renamed onto FILE and the
// directory fsynced: FILE is the old file or the whole new copy, never part of one.
func backupFlags(fs *flag.FlagSet, st stdio) func([]string) error {
	sock := httpSockFlag(fs)
	tcpURL := tcpURLFlag(fs, "refused there: backups are served on http.sock only")
	return func(pos []string) error {
		if len(pos) != 1 {
			return usageError{"backup: want one FILE: xmsg backup [--http-sock P] FILE"}
		}
		file, err := filepath.Abs(pos[0])
		if err != nil {
			return err
		}
		if err := notInUse(file); err != nil {
			return err
		}
		c, err := runningClient(*tcpURL, *sock)
		if err != nil {
			return err
		}
		n, err := c.backup(file)
		if err != nil {
			return err
		}
		fmt.Fprintf(st.out, "backup: %s (%d bytes)\n", file, n)
		return nil
	}
}

const backupAbout = `Asks the running daemon for a consistent copy of its store (one read transaction, taken while
it serves: POST /v1/admin/backup), written 0600 to a temporary file beside FILE, fsynced, checked
as a start checks a store, renamed onto FILE and the directory fsynced: FILE is the old file or
the whole new copy, never part of one. Served on http.sock (a hub's and a leaf's), never on the
TCP listener. Restore: stop the tier, put the copy at --db-path, start it (docs/operations.md §10).`

// notInUse refuses a FILE that a running store holds (bbolt's exclusive flock): renaming a
// copy onto the live file would leave the daemon writing to a file no path names any more.
func notInUse(file string) error {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		return usageError{fmt.Sprintf("backup: %s is a store in use (a running daemon's own file?): name another file", file)}
	}
	return nil
}

// backup fetches the copy into a temporary file beside file and renames it into place.
func (c *busClient) backup(file string) (n int64, err error) {
	resp, err := c.http.Post(c.url("/v1/admin/backup"), "application/json", nil)
	if err != nil {
		return 0, exitError{exitFailure, fmt.Errorf("cannot reach the bus at %s: %v", c.sock, unwrapURL(err))}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return 0, answerError(resp.StatusCode, raw)
	}
	dir := filepath.Dir(file)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(file)+".tmp-*") // 0600
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if n, err = io.Copy(tmp, resp.Body); err != nil {
		return n, exitError{exitFailure, fmt.Errorf("backup: the copy ended after %d bytes: %v", n, err)}
	}
	if resp.ContentLength < 0 || n != resp.ContentLength {
		return n, exitError{exitFailure, fmt.Errorf("backup: got %d bytes of a copy of %d", n, resp.ContentLength)}
	}
	if err = tmp.Sync(); err != nil {
		return n, fmt.Errorf("backup: fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	// The copy is checked as a daemon's start checks its store: a copy that one would refuse
	// is no backup.
	if err = store.Check(tmp.Name()); err != nil {
		return n, exitError{exitFailure, fmt.Errorf("backup: the copy fails its check: %v", err)}
	}
	if err = os.Rename(tmp.Name(), file); err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return n, fmt.Errorf("backup: fsync %s: %w", dir, err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return n, fmt.Errorf("backup: fsync %s: %w", dir, err)
	}
	return n, nil
}
