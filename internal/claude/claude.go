// Package claude discovers Claude Code sessions from their session files and delivers one
// message line to a session's inbox socket (docs/protocol.md §5.1, §2.7).
//
// Session files come and go as sessions start and end, and the protocol promises that a file
// written just before a request is seen by it. Rescanning every directory on every request
// kept that promise at a cost that grew with the number of files, so the Scanner keeps an
// index instead: the directories are watched with inotify, and every request first drains the
// watch (an event is queued by the kernel before the writer's system call returns, so nothing
// written before the request is missed) and re-reads only the files the events name; requests
// that queued while one such refresh ran, having arrived before it started, share it. Whether
// a session's process is alive is not something a file event tells, so it is checked at
// request time, and only for the files a ref resolves to. Where inotify is unavailable, every
// request rescans, as before.
//
// Files are opened without following symlinks and must be regular files owned by our euid, so
// another user (or a planted link) cannot point discovery at a socket of their choosing.
package claude

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/xmsg/xmsg/internal/peercred"
)

// maxFileSize bounds a session file; real ones are a few hundred bytes.
const maxFileSize = 64 << 10

// File is the content of a session file (camelCase as Claude writes it).
type File struct {
	PID                 int             `json:"pid"`
	SessionID           string          `json:"sessionId"`
	Name                *string         `json:"name"`
	Cwd                 string          `json:"cwd"`
	Status              string          `json:"status"`
	Kind                string          `json:"kind"`
	Entrypoint          *string         `json:"entrypoint"`
	Version             *string         `json:"version"`
	StartedAt           json.RawMessage `json:"startedAt"`
	UpdatedAt           json.RawMessage `json:"updatedAt"`
	ProcStart           json.RawMessage `json:"procStart"`
	MessagingSocketPath string          `json:"messagingSocketPath"`
	// WaitingFor says what a session whose status is "waiting" waits for ("permission
	// prompt": among others, a held peer message's Deliver/Deny dialog).
	WaitingFor string `json:"waitingFor"`
}

// Session is one discovered session.
type Session struct {
	File
	// ID is the address of this session: the file's sessionId, or sessionId~N when the same
	// id is live in more than one directory (fork claims, docs/protocol.md §5.1).
	ID    string
	Path  string // canonical path of the session file
	Live  bool   // pid alive and its start time equals procStart, as read by this call
	start string // procStart parsed, when the Session came from the index
}

// Start is the session's recorded process start time (the pid-reuse guard).
func (s Session) Start() string {
	if s.start != "" {
		return s.start
	}
	return procStart(s.ProcStart)
}

// Scanner reads the configured session directories. Safe for concurrent use. The zero value
// with the exported fields set is ready; Close releases the watch.
type Scanner struct {
	Dirs []string
	Proc peercred.Proc
	UID  int // files must be owned by this uid
	Log  *slog.Logger

	// tickets numbers the requests as they arrive, before they wait for mu; fresh (under mu)
	// is the highest ticket the last complete refresh covers: it was the highest issued
	// when that refresh started (see freshen).
	tickets atomic.Uint64
	mu      sync.Mutex
	fresh   uint64
	idx     *index
	warned  map[string]string // by path: the problem last logged, so each is logged once
}

// fileKey identifies one version of a file; the zero key is never trusted.
type fileKey struct {
	dev, ino    uint64
	size, mtime int64
}

// procStart accepts the start time as Claude writes it: a JSON string or a number.
func procStart(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return strings.TrimSpace(string(raw))
}

// AnyDir reports whether at least one configured directory exists.
func (s *Scanner) AnyDir() bool {
	for _, d := range s.Dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return true
		}
	}
	return false
}

// AnyDirReadable reports whether at least one configured directory can be listed. A directory
// can exist (stat works) and still be unreadable: Landlock denies one that was replaced after
// the sandbox was applied, and modes can deny it too.
func (s *Scanner) AnyDirReadable() bool {
	for _, d := range s.Dirs {
		if f, err := os.Open(d); err == nil {
			_, err = f.Readdirnames(1)
			f.Close()
			if err == nil || errors.Is(err, io.EOF) {
				return true
			}
		}
	}
	return false
}

// ErrScanIncomplete wraps the error of a look at the directories that could not read every
// directory or file for lack of descriptors or memory (EMFILE, ENFILE, ENOMEM): a session
// missing from it may well be live, so "not found" would be a wrong answer. What could not be
// read is tried again by the next look.
var ErrScanIncomplete = errors.New("claude: session scan incomplete")

// transient reports errors that say nothing about the directory or file, only about this
// process running short (descriptors, memory).
func transient(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOBUFS)
}

// Problems lists the directories that exist but cannot be read or watched as of now, each
// with the reason (for /healthz): their sessions are not served, rather than served stale.
func (s *Scanner) Problems() []string {
	t := s.arrive()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.freshen(t)
	var out []string
	for _, d := range s.idx.dirs {
		if d.problem != "" {
			out = append(out, d.path+": "+d.problem)
		}
	}
	return out
}

// WatchReport says how the session directories are kept fresh, for xmsg doctor: watched by
// inotify (a request reads only what changed), or rescanned on every request, and why. A
// directory that does not exist is neither (/healthz reports it).
func (s *Scanner) WatchReport() string {
	t := s.arrive()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.freshen(t)
	x := s.idx
	if len(x.dirs) == 0 {
		return "none configured"
	}
	if x.noWatch {
		return "rescanned on every request (no inotify: " + x.whyNot + ")"
	}
	var rescanned []string
	for _, d := range x.dirs {
		if d.wd < 0 && d.id != (dirID{}) {
			rescanned = append(rescanned, d.path+": "+d.whyNot)
		}
	}
	if len(rescanned) > 0 {
		return "rescanned on every request, not watched: " + strings.Join(rescanned, "; ")
	}
	return "watched by inotify (a request reads only what changed)"
}

// CanWatch reports whether this machine lets a process watch directories (inotify): nil, or
// why not.
func CanWatch() error {
	w, err := newWatcher()
	if err == nil {
		w.close()
	}
	return err
}

// Close stops watching. A closed Scanner keeps answering by rescanning.
func (s *Scanner) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.idx != nil && s.idx.w != nil {
		s.idx.w.close()
		s.idx.w = nil
		s.idx.noWatch, s.idx.whyNot = true, "the scanner is closed"
	}
	if s.idx != nil {
		for _, e := range s.idx.byPath {
			if e.pidfd != nil {
				e.pidfd.Close()
				e.pidfd = nil
			}
		}
	}
}

// Scan returns every readable session, live or not, with fork claims assigned, ordered by
// path. It checks the liveness of every file: it is for listing, not for resolving a ref.
func (s *Scanner) Scan() []Session {
	out, _ := s.ScanErr()
	return out
}

// ScanErr is Scan that also reports, wrapped in ErrScanIncomplete, whether some directory or
// file could not be read for lack of resources; the sessions known are returned either way.
func (s *Scanner) ScanErr() ([]Session, error) {
	t := s.arrive()
	s.mu.Lock()
	incomplete := s.freshen(t)
	all := make([]entryData, 0, len(s.idx.byPath))
	for _, e := range s.idx.byPath {
		all = append(all, e.data())
	}
	s.mu.Unlock()
	out, unknown := s.sessions(all, nil)
	return out, firstErr(incomplete, unknown)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Lookup returns the sessions a ref could mean: those whose id (with its fork claim, case
// insensitive) is ref, whose name is ref, or, when pid > 0, whose pid is pid. Liveness is
// checked for these and for the files that share their session ids (the fork claims depend
// on which of those are live), and for nothing else. The error is as for ScanErr.
func (s *Scanner) Lookup(ref string, pid int) ([]Session, error) {
	t := s.arrive()
	s.mu.Lock()
	incomplete := s.freshen(t)
	groups := map[string]bool{}
	add := func(set map[*entry]struct{}) {
		for e := range set {
			groups[strings.ToLower(e.file.SessionID)] = true
		}
	}
	key := strings.ToLower(ref)
	add(s.idx.byID[key])
	if base, _, ok := strings.Cut(key, "~"); ok {
		add(s.idx.byID[base])
	}
	add(s.idx.byName[ref])
	if pid > 0 {
		add(s.idx.byPID[pid])
	}
	cands := s.idx.groupData(groups)
	s.mu.Unlock()
	out, unknown := s.sessions(cands, func(se Session) bool {
		return strings.EqualFold(se.ID, ref) || (pid > 0 && se.PID == pid) || (se.Name != nil && *se.Name == ref)
	})
	return out, firstErr(incomplete, unknown)
}

// ByPID returns the sessions whose file names pid (for attributing a caller). The error is as
// for ScanErr.
func (s *Scanner) ByPID(pid int) ([]Session, error) {
	t := s.arrive()
	s.mu.Lock()
	incomplete := s.freshen(t)
	groups := map[string]bool{}
	for e := range s.idx.byPID[pid] {
		groups[strings.ToLower(e.file.SessionID)] = true
	}
	cands := s.idx.groupData(groups)
	s.mu.Unlock()
	out, unknown := s.sessions(cands, func(se Session) bool { return se.PID == pid })
	return out, firstErr(incomplete, unknown)
}

// Still reports whether the session file at path (a canonical path, as in Session.Path)
// still names process pid with start time start, is addressed as id, and that process is
// alive. It is for a caller attributed to that file once (agent.sock's attestation): the
// same freshness as Lookup, liveness by the entry's pidfd where it has one (no /proc read),
// and only the files sharing its session id are looked at (they decide its fork claim).
// closer are the caller's processes between itself and pid (itself included): if one of them
// has a session file now, the answer is false, since a walk would stop there (the closest
// ancestor with a session is the caller's session). The error is as for ScanErr; then the
// answer is false.
func (s *Scanner) Still(path, id string, pid int, start string, closer []peercred.Stat) (bool, error) {
	t := s.arrive()
	s.mu.Lock()
	if err := s.freshen(t); err != nil {
		s.mu.Unlock()
		return false, err
	}
	e := s.idx.byPath[path]
	if e == nil || e.file.PID != pid || start == "" || e.start != start || s.claimedLocked(closer) {
		s.mu.Unlock()
		return false, nil
	}
	cands := s.idx.groupData(map[string]bool{strings.ToLower(e.file.SessionID): true})
	s.mu.Unlock()
	found, unknown := s.sessions(cands, func(se Session) bool { return se.Path == path })
	if unknown != nil {
		return false, unknown
	}
	// found is the copy of e taken under mu (pid and start as checked above).
	for _, se := range found {
		if se.Live && se.ID == id {
			return true, nil
		}
	}
	return false, nil
}

// Claims reports whether one of procs (by pid and start time) has a session file now, with
// the same freshness as Lookup. It is conservative: a file that a walk would then find not
// live (a fork's, say) still counts, and the caller walks to find out.
func (s *Scanner) Claims(procs []peercred.Stat) (bool, error) {
	if len(procs) == 0 {
		return false, nil
	}
	t := s.arrive()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.freshen(t); err != nil {
		return false, err
	}
	return s.claimedLocked(procs), nil
}

// claimedLocked is Claims on an index the caller holds mu for and has freshened.
func (s *Scanner) claimedLocked(procs []peercred.Stat) bool {
	for _, st := range procs {
		for e := range s.idx.byPID[st.PID] {
			if st.StartTime != "" && e.start == st.StartTime {
				return true
			}
		}
	}
	return false
}

// ByID returns the live session whose address is exactly id.
func (s *Scanner) ByID(id string) (Session, bool) {
	found, _ := s.Lookup(id, 0)
	for _, se := range found {
		if se.Live && se.ID == id {
			return se, true
		}
	}
	return Session{}, false
}

// sessions checks liveness, assigns fork claims and keeps what keep accepts (nil: all).
// It runs without the lock: reading /proc is the slow part, and needs no index.
func (s *Scanner) sessions(files []entryData, keep func(Session) bool) ([]Session, error) {
	// Fork claims are deterministic: the first file by sorted canonical path keeps the id.
	slices.SortFunc(files, func(a, b entryData) int { return strings.Compare(a.path, b.path) })
	out := make([]Session, 0, len(files))
	// Only live sessions take part: a stale file left by a dead session must not push the live
	// one off its own id. (One file, the usual lookup, claims nothing: no map for it.)
	var claims map[string]int
	if len(files) > 1 {
		claims = map[string]int{}
	}
	var unknown error
	for _, f := range files {
		live, err := s.alive(f)
		if err != nil && unknown == nil {
			unknown = fmt.Errorf("%w: %w", ErrScanIncomplete, err)
		}
		se := Session{File: f.file, ID: f.file.SessionID, Path: f.path, Live: live, start: f.start}
		if se.Live && claims != nil {
			key := strings.ToLower(se.SessionID)
			claims[key]++
			if n := claims[key]; n > 1 {
				se.ID = fmt.Sprintf("%s~%d", se.SessionID, n)
			}
		}
		if keep == nil || keep(se) {
			out = append(out, se)
		}
	}
	return out, unknown
}

// alive checks f's process: by its pidfd when it has one, else in /proc, and then gives it
// a pidfd for next time.
//
// An error means liveness could not be told for lack of resources (EMFILE, ...): the process
// may well be alive, so the caller must not answer as if it were gone.
func (s *Scanner) alive(f entryData) (bool, error) {
	start := f.start
	if f.pidfd != nil {
		if exited, known := f.pidfd.Exited(); known {
			return !exited, nil
		}
	}
	if start == "" {
		return false, nil
	}
	st, err := s.Proc.Stat(f.file.PID)
	if err != nil && transient(err) {
		return false, err
	}
	if err != nil || st.StartTime != start {
		return false, nil
	}
	if f.pidfd == nil {
		if pf, err := s.Proc.OpenPidfd(f.file.PID, start); err == nil {
			s.mu.Lock()
			if s.idx.byPath[f.path] == f.e && f.e.pidfd == nil {
				f.e.pidfd, pf = pf, nil
			}
			s.mu.Unlock()
			if pf != nil {
				pf.Close()
			}
		}
	}
	return true, nil
}

// warn logs a problem with a session file once, not on every look at it. The caller holds mu.
func (s *Scanner) warn(path, problem string, attrs ...any) {
	if s.warned == nil {
		s.warned = map[string]string{}
	}
	again := s.warned[path] == problem
	s.warned[path] = problem
	if !again {
		s.Log.Warn(problem, append([]any{"path", path}, attrs...)...)
	}
}

// fine forgets a logged problem of path, so that it is logged again if it comes back.
func (s *Scanner) fine(path string) { delete(s.warned, path) }
