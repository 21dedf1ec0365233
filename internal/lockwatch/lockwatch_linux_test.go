//go:build linux

package lockwatch

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

type event struct{ dir, name string }

func TestWatch(t *testing.T) {
	events := make(chan event, 16)
	w, err := New(func(dir, name string) { events <- event{dir, name} }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dir := filepath.Join(t.TempDir(), "locks")
	os.Mkdir(dir, 0o700)
	lock := filepath.Join(dir, "a.lock")
	os.WriteFile(lock, nil, 0o600)
	if err := w.Watch(dir); err != nil {
		t.Fatal(err)
	}
	if err := w.Watch(dir); err != nil { // idempotent
		t.Fatal(err)
	}
	next := func(want event) {
		t.Helper()
		select {
		case got := <-events:
			if got != want {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("no event, want %+v", want)
		}
	}
	os.Remove(lock)
	next(event{dir, "a.lock"})
	// Replaced by a rename onto its name: another file, so the old lock is gone too.
	os.WriteFile(filepath.Join(dir, "b.tmp"), nil, 0o600)
	next(event{dir, "b.tmp"}) // created
	os.Rename(filepath.Join(dir, "b.tmp"), lock)
	next(event{dir, "b.tmp"})  // moved from
	next(event{dir, "a.lock"}) // moved to
	// The directory itself goes: every lock in it is gone.
	os.RemoveAll(dir)
	for {
		select {
		case got := <-events:
			if got.name == "" {
				if got.dir != dir {
					t.Fatalf("dir event for %s, want %s", got.dir, dir)
				}
				return
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no event for the removed directory")
		}
	}
}

func TestWatchMissingDir(t *testing.T) {
	w, err := New(func(string, string) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Watch(filepath.Join(t.TempDir(), "nope")); err == nil {
		t.Fatal("watching a missing directory succeeded")
	}
}
