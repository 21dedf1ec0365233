//go:build linux

package lockwatch

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watcher follows lock directories with inotify and reports every lock file that goes away
// or is replaced, so that a lease ends the moment its lock does, not at the next request.
type Watcher struct {
	f    *os.File
	gone func(dir, name string) // name "" = everything in dir (the directory itself went away)
	log  *slog.Logger

	mu   sync.Mutex
	wds  map[int32]string
	dirs map[string]int32
	done chan struct{}
}

// The events that end a lease: the name is unlinked, renamed away, or another file is
// created or renamed onto it; the directory itself is removed, renamed or unmounted.
const (
	nameEvents = unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_CREATE
	selfEvents = unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_UNMOUNT | unix.IN_IGNORED
)

// New starts a watcher; gone is called (from the watcher's goroutine) for each lock
// that went away: gone(dir, name), or gone(dir, "") when every lock in dir must be taken as
// gone. When the kernel drops events (queue overflow) every watched directory is reported,
// failing closed: leases are re-established by the next attested call.
func New(gone func(dir, name string), log *slog.Logger) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("lockwatch: inotify: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{f: os.NewFile(uintptr(fd), "inotify"), gone: gone, log: log, wds: map[int32]string{}, dirs: map[string]int32{}, done: make(chan struct{})}
	go w.run()
	return w, nil
}

// Watch starts following dir (idempotent).
func (w *Watcher) Watch(dir string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.dirs[dir]; ok {
		return nil
	}
	raw, err := w.f.SyscallConn()
	if err != nil {
		return fmt.Errorf("lockwatch: inotify: %w", err)
	}
	var wd int
	var addErr error
	if err := raw.Control(func(fd uintptr) {
		wd, addErr = unix.InotifyAddWatch(int(fd), dir, nameEvents|selfEvents|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW)
	}); err != nil {
		return fmt.Errorf("lockwatch: inotify: %w", err)
	}
	if addErr != nil {
		return fmt.Errorf("lockwatch: watch %s: %w", dir, addErr)
	}
	w.wds[int32(wd)] = dir
	w.dirs[dir] = int32(wd)
	return nil
}

// Close stops the watcher.
func (w *Watcher) Close() error {
	err := w.f.Close()
	<-w.done
	return err
}

func (w *Watcher) run() {
	defer close(w.done)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.log.Error("lock watch stopped; ending every lease", "err", err)
				w.all()
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameLen := int(ev.Len)
			end := off + unix.SizeofInotifyEvent + nameLen
			if end > n {
				break
			}
			name := ""
			if nameLen > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : end]
				for i, c := range raw {
					if c == 0 {
						raw = raw[:i]
						break
					}
				}
				name = string(raw)
			}
			off = end
			w.event(ev.Wd, ev.Mask, name)
		}
	}
}

func (w *Watcher) event(wd int32, mask uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.log.Warn("lock watch overflowed; ending every lease")
		w.all()
		return
	}
	w.mu.Lock()
	dir, ok := w.wds[wd]
	if ok && mask&selfEvents != 0 {
		// The directory is gone (or replaced): its watch is dead, and so is every lock in it.
		delete(w.wds, wd)
		delete(w.dirs, dir)
	}
	w.mu.Unlock()
	switch {
	case !ok:
	case mask&selfEvents != 0:
		w.gone(dir, "")
	case mask&nameEvents != 0 && name != "":
		w.gone(dir, name)
	}
}

func (w *Watcher) all() {
	w.mu.Lock()
	var dirs []string
	for d := range w.dirs {
		dirs = append(dirs, d)
	}
	w.mu.Unlock()
	for _, d := range dirs {
		w.gone(d, "")
	}
}
