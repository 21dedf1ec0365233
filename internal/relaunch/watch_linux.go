//go:build linux

package relaunch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Settle is how long a Watch waits after the first change before it fires: long enough for a
// `mkdir -p` or an installer's first few steps, so that one change is one relaunch.
var Settle = 500 * time.Millisecond

// Watch reports, once, that a session directory appeared or was replaced.
type Watch struct {
	f       *os.File
	targets map[int32][]target
	c       chan string
	once    sync.Once
}

// target is what one inotify watch stands for: a change to dir, seen either as an event on the
// watched directory itself (name "") or as name appearing in it.
type target struct {
	dir  string // the session directory this is about
	name string // the entry to match; "" for the watched directory's own removal or move
}

// NewWatch watches dirs: an existing directory for its removal or replacement (its own
// IN_DELETE_SELF/IN_MOVE_SELF, and its name created or moved into its parent), a missing one
// at its nearest existing ancestor for the next component of its path. Call it before the
// sandbox. A directory nothing can be watched for is reported in skipped, not as an error:
// the daemon serves without it as before.
func NewWatch(dirs []string) (w *Watch, skipped map[string]error, err error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("relaunch: inotify: %w", err)
	}
	w = &Watch{f: os.NewFile(uintptr(fd), "inotify"), targets: map[int32][]target{}, c: make(chan string, 1)}
	skipped = map[string]error{}
	add := func(path string, mask uint32, t target) error {
		wd, err := unix.InotifyAddWatch(fd, path, mask|unix.IN_MASK_ADD|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW)
		if err != nil {
			return fmt.Errorf("relaunch: watch %s: %w", path, err)
		}
		w.targets[int32(wd)] = append(w.targets[int32(wd)], t)
		return nil
	}
	for _, dir := range dirs {
		dir = filepath.Clean(dir)
		if fi, err := os.Lstat(dir); err == nil && fi.IsDir() {
			err := add(dir, unix.IN_DELETE_SELF|unix.IN_MOVE_SELF, target{dir: dir})
			if err == nil && filepath.Dir(dir) != dir {
				err = add(filepath.Dir(dir), unix.IN_CREATE|unix.IN_MOVED_TO, target{dir: dir, name: filepath.Base(dir)})
			}
			if err != nil {
				skipped[dir] = err
			}
			continue
		}
		anc, next, err := nearestAncestor(dir)
		if err == nil {
			err = add(anc, unix.IN_CREATE|unix.IN_MOVED_TO, target{dir: dir, name: next})
		}
		if err != nil {
			skipped[dir] = err
		}
	}
	go w.read()
	return w, skipped, nil
}

// nearestAncestor returns the closest existing directory above dir and the name of the next
// component below it on dir's path.
func nearestAncestor(dir string) (anc, next string, err error) {
	for p := dir; ; {
		parent := filepath.Dir(p)
		if parent == p {
			return "", "", errors.New("relaunch: no existing ancestor")
		}
		if fi, err := os.Stat(parent); err == nil {
			if !fi.IsDir() {
				return "", "", fmt.Errorf("relaunch: %s is not a directory", parent)
			}
			return parent, filepath.Base(p), nil
		}
		p = parent
	}
}

// C receives the session directory that changed, once.
func (w *Watch) C() <-chan string { return w.c }

// Close stops the watch.
func (w *Watch) Close() error { return w.f.Close() }

func (w *Watch) read() {
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return // closed
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				for i, b := range raw {
					if b == 0 {
						raw = raw[:i]
						break
					}
				}
				name = string(raw)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_IGNORED != 0 {
				continue
			}
			for _, t := range w.targets[ev.Wd] {
				if t.name == name {
					w.fire(t.dir)
				}
			}
		}
	}
}

// fire reports dir after Settle, the first time only.
func (w *Watch) fire(dir string) {
	w.once.Do(func() {
		time.AfterFunc(Settle, func() { w.c <- dir })
	})
}
