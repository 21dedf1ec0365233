package claude

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/xmsg/xmsg/internal/peercred"
)

// watcher reports changes in watched directories (inotify on Linux). add returns a watch
// descriptor; drain calls fn for every event queued so far and returns without waiting.
// overflow (events were lost) is reported as wd -1.
type watcher interface {
	add(dir string) (int, error)
	rm(wd int)
	drain(fn func(wd int, ev event, name string)) error
	close()
}

type event int

const (
	evFile     event = iota // a file in the directory changed, appeared or went away
	evDirGone               // the directory itself was removed, moved or unwatched
	evOverflow              // events were lost: everything must be read again
)

// startWatch makes the watcher; tests replace it.
var startWatch = newWatcher

// index is what the Scanner knows about its directories. Guarded by Scanner.mu.
type index struct {
	dirs    []*dirState
	w       watcher
	noWatch bool   // the watcher could not be made (or is closed): rescan on every request
	whyNot  string // why not, for WatchReport
	byPath  map[string]*entry
	byID    map[string]map[*entry]struct{} // lower-case sessionId
	byName  map[string]map[*entry]struct{}
	byPID   map[int]map[*entry]struct{}
}

// dirState is one configured directory.
type dirState struct {
	path    string
	canon   string // canonical path, for the files' canonical paths (fork-claim order)
	wd      int    // watch descriptor, -1 = not watched
	id      dirID  // the directory the entries were read from; zero = not read
	entries map[string]*entry
	dirty   map[string]bool // file names with events since the last look
	rescan  bool
	problem string // why the directory is not served, or ""
	whyNot  string // why it is not watched (rescanned on every request), or ""
}

type dirID struct{ dev, ino uint64 }

// entry is one valid session file.
type entry struct {
	path  string // canonical
	key   fileKey
	file  File
	start string // procStart(file.ProcStart), parsed once when the file is read
	// pidfd names the file's process once it was seen alive: liveness is then one poll(2)
	// instead of a /proc read. Kept across rewrites that keep pid and procStart.
	pidfd *peercred.Pidfd
}

// entryData is a copy of an entry, safe to use without the lock.
type entryData struct {
	e     *entry
	path  string
	file  File
	start string
	pidfd *peercred.Pidfd
}

func (e *entry) data() entryData {
	return entryData{e: e, path: e.path, file: e.file, start: e.start, pidfd: e.pidfd}
}

func addTo[K comparable](m map[K]map[*entry]struct{}, k K, e *entry) {
	set := m[k]
	if set == nil {
		set = map[*entry]struct{}{}
		m[k] = set
	}
	set[e] = struct{}{}
}

func removeFrom[K comparable](m map[K]map[*entry]struct{}, k K, e *entry) {
	if set := m[k]; set != nil {
		delete(set, e)
		if len(set) == 0 {
			delete(m, k)
		}
	}
}

func (x *index) insert(d *dirState, name string, e *entry) {
	if old := d.entries[name]; old != nil && old.pidfd != nil && old.file.PID == e.file.PID && old.start == e.start {
		e.pidfd, old.pidfd = old.pidfd, nil
	}
	x.remove(d, name)
	d.entries[name] = e
	x.byPath[e.path] = e
	addTo(x.byID, strings.ToLower(e.file.SessionID), e)
	addTo(x.byPID, e.file.PID, e)
	if e.file.Name != nil {
		addTo(x.byName, *e.file.Name, e)
	}
}

func (x *index) remove(d *dirState, name string) {
	e := d.entries[name]
	if e == nil {
		return
	}
	delete(d.entries, name)
	delete(x.byPath, e.path)
	if e.pidfd != nil {
		e.pidfd.Close()
	}
	removeFrom(x.byID, strings.ToLower(e.file.SessionID), e)
	removeFrom(x.byPID, e.file.PID, e)
	if e.file.Name != nil {
		removeFrom(x.byName, *e.file.Name, e)
	}
}

func (x *index) clear(d *dirState) {
	for name := range d.entries {
		x.remove(d, name)
	}
}

// groupData copies every entry whose lower-case session id is in groups.
func (x *index) groupData(groups map[string]bool) []entryData {
	var out []entryData
	for g := range groups {
		for e := range x.byID[g] {
			out = append(out, e.data())
		}
	}
	return out
}

// arrive numbers a request that is about to look at the index, before it waits for mu.
func (s *Scanner) arrive() uint64 { return s.tickets.Add(1) }

// freshen is refresh for the request with ticket t, shared by concurrent requests. The
// promise is that everything written before a request arrived is seen by it, and a refresh
// that started after the request arrived keeps that promise as well as one of its own: its
// drain and stats come after the request's arrival, hence after anything written before it.
// So each refresh records, before it starts, the highest ticket issued so far, and a request
// whose ticket a completed refresh covers skips its own: of the requests that queued on mu
// while one refresh ran, the first to get mu refreshes for all of them.
//
// Only a complete refresh covers anything. An incomplete one (ErrScanIncomplete) leaves
// fresh where it was, so every waiting request tries again itself, as without coalescing.
// Lost events (overflow), a replaced or vanished directory, and the no-watch fallback are
// all dealt with inside the one refresh that meets them (rescanDir), so a refresh that
// returns nil has read whatever they made necessary. The caller holds mu.
func (s *Scanner) freshen(t uint64) error {
	if t <= s.fresh {
		return nil
	}
	start := s.tickets.Load()
	if err := s.refresh(); err != nil {
		return err
	}
	s.fresh = start
	return nil
}

// refresh brings the index up to date with everything that happened before this call. The
// caller holds mu. A non-nil result (wrapping ErrScanIncomplete) means something could not be
// read for lack of resources; it is tried again by the next refresh.
func (s *Scanner) refresh() (incomplete error) {
	x := s.idx
	if x == nil {
		x = &index{byPath: map[string]*entry{}, byID: map[string]map[*entry]struct{}{},
			byName: map[string]map[*entry]struct{}{}, byPID: map[int]map[*entry]struct{}{}}
		for _, p := range s.Dirs {
			x.dirs = append(x.dirs, &dirState{path: p, wd: -1, entries: map[string]*entry{}, dirty: map[string]bool{}, rescan: true})
		}
		// No directory, nothing to watch: a scanner without directories (a leaf's) opens no
		// inotify instance.
		if len(s.Dirs) > 0 {
			w, err := startWatch()
			if err != nil {
				x.noWatch, x.whyNot = true, err.Error()
				s.Log.Warn("session dirs cannot be watched; every request rescans them", "err", err)
			}
			x.w = w
		}
		s.idx = x
	}
	if x.w != nil {
		err := x.w.drain(func(wd int, ev event, name string) {
			for _, d := range x.dirs {
				switch {
				case ev == evOverflow:
					d.rescan = true
				case d.wd != wd:
				case ev == evDirGone:
					d.rescan = true // rescanDir drops the old watch (if the kernel has not)
				case strings.HasSuffix(name, ".json"):
					d.dirty[name] = true
				}
			}
		})
		if err != nil {
			s.Log.Warn("session dir watch failed; every request rescans them", "err", err)
			x.w.close()
			x.w, x.noWatch, x.whyNot = nil, true, "the watch failed: "+err.Error()
		}
	}
	for _, d := range x.dirs {
		if err := s.refreshDir(x, d); err != nil && incomplete == nil {
			incomplete = fmt.Errorf("%w: %w", ErrScanIncomplete, err)
		}
	}
	return incomplete
}

func (s *Scanner) refreshDir(x *index, d *dirState) error {
	id, err := statDir(d.path)
	if err != nil && transient(err) {
		return err
	}
	if err != nil {
		// Gone (or never there): nothing to serve, nothing to warn about unless it is
		// something other than absence.
		x.clear(d)
		if d.wd >= 0 && x.w != nil {
			x.w.rm(d.wd)
		}
		d.wd, d.id, d.dirty = -1, dirID{}, map[string]bool{}
		d.problem = ""
		if !errors.Is(err, os.ErrNotExist) {
			d.problem = "unreadable: " + err.Error()
			s.warn(d.path, "session dir unreadable", "err", err)
		}
		return nil
	}
	if id != d.id || d.wd < 0 || x.noWatch {
		d.rescan = true
	}
	if d.rescan {
		return s.rescanDir(x, d, id)
	}
	var incomplete error
	for name := range d.dirty {
		if err := s.readFile(x, d, name, true); err != nil {
			incomplete = err // stays dirty: read again next time
			continue
		}
		delete(d.dirty, name)
	}
	return incomplete
}

// rescanDir (re)watches d and reads every file in it. The watch is added before the listing,
// so a file written during the listing is either listed or reported by the next drain.
func (s *Scanner) rescanDir(x *index, d *dirState, id dirID) error {
	if d.wd >= 0 && x.w != nil {
		x.w.rm(d.wd)
	}
	d.wd = -1
	watchErr := error(nil)
	if x.w != nil {
		d.wd, watchErr = x.w.add(d.path)
		if watchErr != nil {
			d.wd = -1
		}
	}
	clear(d.dirty)
	names, err := listDir(d.path)
	if err != nil && transient(err) {
		// Not the directory's fault: keep what is known, and look again next time.
		return err
	}
	if err != nil {
		// Typically a directory removed and created again while Landlock is applied: its rules
		// name the old directory, so the new one is out of reach until the daemon restarts.
		// Say so, and serve nothing from it rather than what it held before.
		x.clear(d)
		d.id = dirID{}
		d.problem = "unreadable (recreated after the sandbox was applied? restart the daemon): " + err.Error()
		s.warn(d.path, "session dir unreadable; its sessions are not served", "err", err)
		return nil
	}
	d.whyNot = ""
	if watchErr != nil {
		d.whyNot = watchErr.Error()
	}
	if watchErr != nil && !x.noWatch {
		s.warn(d.path, "session dir cannot be watched; every request rescans it", "err", watchErr)
	} else {
		s.fine(d.path)
	}
	d.problem = ""
	d.canon = d.path
	if c, err := filepath.EvalSymlinks(d.path); err == nil {
		d.canon = c
	}
	seen := map[string]bool{}
	var incomplete error
	for _, name := range names {
		// Only *.json is ever opened; *.key files hold secrets and stay unopened.
		if strings.HasSuffix(name, ".json") {
			seen[name] = true
			if err := s.readFile(x, d, name, false); err != nil {
				incomplete = err
			}
		}
	}
	for name := range d.entries {
		if !seen[name] {
			s.fine(filepath.Join(d.path, name))
			x.remove(d, name)
		}
	}
	d.id, d.rescan = id, false
	if incomplete != nil {
		d.rescan = true // what could not be read is read again next time
	}
	return incomplete
}

// readFile reads d/name again (or notices it is gone) and updates the index. Unless force
// is set, a file whose version (device, inode, size, mtime) is the one already parsed is not
// read again; an event naming the file forces the read, since a rewrite within one mtime
// tick can keep the version.
//
// A transient error (descriptors, memory) is returned and changes nothing: the file is
// neither dropped nor warned about.
func (s *Scanner) readFile(x *index, d *dirState, name string, force bool) error {
	path := filepath.Join(d.path, name)
	old := d.entries[name]
	raw, key, err := readSessionFile(d.path, name, s.UID, func(k fileKey) bool {
		return !force && old != nil && k != (fileKey{}) && old.key == k
	})
	if err != nil && transient(err) {
		return err
	}
	if errors.Is(err, os.ErrNotExist) {
		s.fine(path)
		x.remove(d, name)
		return nil
	}
	if err != nil {
		s.warn(path, "session file skipped", "err", err)
		x.remove(d, name)
		return nil
	}
	if raw == nil {
		return nil // unchanged
	}
	var f File
	if err := json.Unmarshal(raw, &f); err != nil || f.SessionID == "" || f.PID <= 0 {
		s.warn(path, "session file malformed")
		x.remove(d, name)
		return nil
	}
	s.fine(path)
	x.insert(d, name, &entry{path: filepath.Join(d.canon, name), key: key, file: f, start: procStart(f.ProcStart)})
	return nil
}

func listDir(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	sort.Strings(names)
	return names, err
}
