//go:build linux

package claude

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// statDir identifies the directory at path (following a symlink, as reading it does).
func statDir(path string) (dirID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return dirID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return dirID{}, fmt.Errorf("%s is not a directory", path)
	}
	return dirID{dev: uint64(st.Dev), ino: st.Ino}, nil
}

// inotify is a non-blocking inotify instance: draining it never waits.
type inotify struct {
	fd  int
	buf []byte
}

// watchMask is every change that can make a session file appear, change, or go away, and
// the directory itself going away.
const watchMask = unix.IN_CREATE | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_MOVED_TO | unix.IN_MOVED_FROM |
	unix.IN_DELETE | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

func newWatcher() (watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("claude: inotify: %w", err)
	}
	return &inotify{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (w *inotify) add(dir string) (int, error) {
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return -1, fmt.Errorf("claude: watch %s: %w", dir, err)
	}
	return wd, nil
}

func (w *inotify) rm(wd int) { unix.InotifyRmWatch(w.fd, uint32(wd)) }

func (w *inotify) close() { unix.Close(w.fd) }

func (w *inotify) drain(fn func(wd int, ev event, name string)) error {
	for {
		n, err := unix.Read(w.fd, w.buf)
		if errors.Is(err, unix.EAGAIN) {
			return nil
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("claude: read inotify: %w", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&w.buf[off]))
			end := off + unix.SizeofInotifyEvent + int(raw.Len)
			if end > n {
				return errors.New("claude: short inotify event")
			}
			name := w.buf[off+unix.SizeofInotifyEvent : end]
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			switch {
			case raw.Mask&unix.IN_Q_OVERFLOW != 0:
				fn(-1, evOverflow, "")
			case raw.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED|unix.IN_UNMOUNT) != 0:
				fn(int(raw.Wd), evDirGone, "")
			default:
				fn(int(raw.Wd), evFile, string(name))
			}
			off = end
		}
	}
}
