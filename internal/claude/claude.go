// Package claude discovers Claude Code sessions from their session files and delivers one
// message line to a session's inbox socket (docs/protocol.md §5.1, §2.7).
//
// Session files are re-read on every call: Claude writes and removes them as sessions come and
// go, and a cache would answer with sessions that are gone. Files are opened without following
// symlinks and must be regular files owned by our euid, so another user (or a planted link)
// cannot point discovery at a socket of their choosing.
package claude

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
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
}

// Session is one discovered session.
type Session struct {
	File
	// ID is the address of this session: the file's sessionId, or sessionId~N when the same
	// id is live in more than one directory (fork claims, docs/protocol.md §5.1).
	ID   string
	Path string // canonical path of the session file
	Live bool   // pid alive and its start time equals procStart
}

// Start is the session's recorded process start time (the pid-reuse guard).
func (s Session) Start() string { return procStart(s.ProcStart) }

// Scanner reads the configured session directories. Safe for concurrent use.
type Scanner struct {
	Dirs []string
	Proc peercred.Proc
	UID  int // files must be owned by this uid
	Log  *slog.Logger

	mu     sync.Mutex
	parsed map[string]parsedFile // by path: the last version read, to skip re-parsing it
	warned map[string]string     // by path: the problem last logged, so each is logged once
}

// fileKey identifies one version of a file; the zero key is never trusted.
type fileKey struct {
	dev, ino    uint64
	size, mtime int64
}

type parsedFile struct {
	key  fileKey
	file File
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

// ErrScanIncomplete wraps the error of a scan that could not read every directory or file
// for lack of descriptors or memory (EMFILE, ENFILE, ENOMEM): a session missing from such a
// scan may well be live, so "not found" would be a wrong answer.
var ErrScanIncomplete = errors.New("claude: session scan incomplete")

// Scan returns every readable session, live or not, with fork claims assigned.
func (s *Scanner) Scan() []Session {
	out, _ := s.ScanErr()
	return out
}

// ScanErr is Scan that also reports, wrapped in ErrScanIncomplete, whether some directory or
// file could not be read for lack of resources; the sessions found are returned either way.
func (s *Scanner) ScanErr() ([]Session, error) {
	var out []Session
	var incomplete error
	seen := map[string]bool{}
	for _, dir := range s.Dirs {
		found, err := s.scanDir(dir, seen)
		out = append(out, found...)
		if err != nil && incomplete == nil {
			incomplete = fmt.Errorf("%w: %w", ErrScanIncomplete, err)
		}
	}
	s.forget(seen)
	// Fork claims are deterministic: the first file by sorted canonical path keeps the id.
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	// Only live sessions take part: a stale file left by a dead session must not push the live
	// one off its own id.
	seen2 := map[string]int{}
	for i := range out {
		out[i].ID = out[i].SessionID
		if !out[i].Live {
			continue
		}
		key := strings.ToLower(out[i].SessionID)
		seen2[key]++
		if n := seen2[key]; n > 1 {
			out[i].ID = fmt.Sprintf("%s~%d", out[i].SessionID, n)
		}
	}
	return out, incomplete
}

// transient reports errors that say nothing about the directory or file, only about this
// process running short (descriptors, memory).
func transient(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOBUFS)
}

// warn logs a problem with a session file once, not on every rescan (every request rescans).
func (s *Scanner) warn(path, problem string, attrs ...any) {
	s.mu.Lock()
	if s.warned == nil {
		s.warned = map[string]string{}
	}
	again := s.warned[path] == problem
	s.warned[path] = problem
	s.mu.Unlock()
	if !again {
		s.Log.Warn(problem, append([]any{"path", path}, attrs...)...)
	}
}

// forget drops what is remembered about files that are gone or fine now.
func (s *Scanner) forget(seen map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.parsed {
		if !seen[p] {
			delete(s.parsed, p)
		}
	}
	for p := range s.warned {
		if !seen["!"+p] {
			delete(s.warned, p)
		}
	}
}

func (s *Scanner) scanDir(dir string, seen map[string]bool) ([]Session, error) {
	var incomplete error
	names, err := listDir(dir)
	if err != nil {
		if transient(err) {
			return nil, err
		}
		if !os.IsNotExist(err) {
			s.warn(dir, "session dir unreadable", "err", err)
			seen["!"+dir] = true
		}
		return nil, nil
	}
	// Fork claims order files by canonical path: resolve the directory once per scan.
	canonDir := dir
	if c, err := filepath.EvalSymlinks(dir); err == nil {
		canonDir = c
	}
	var out []Session
	for _, name := range names {
		// Only *.json is ever opened; *.key files hold secrets and stay unopened.
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(dir, name)
		var cached File
		raw, key, err := readSessionFile(dir, name, s.UID, func(k fileKey) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			p, ok := s.parsed[path]
			cached = p.file
			return ok && k != (fileKey{}) && p.key == k
		})
		if err != nil {
			if transient(err) {
				// Not the file's fault: remember nothing about it, and tell the caller.
				incomplete = err
				seen[path] = true
				continue
			}
			s.warn(path, "session file skipped", "err", err)
			seen["!"+path] = true
			continue
		}
		f := cached
		if raw != nil {
			f = File{}
			if err := json.Unmarshal(raw, &f); err != nil || f.SessionID == "" || f.PID <= 0 {
				s.warn(path, "session file malformed")
				seen["!"+path] = true
				continue
			}
			if key != (fileKey{}) {
				s.mu.Lock()
				if s.parsed == nil {
					s.parsed = map[string]parsedFile{}
				}
				s.parsed[path] = parsedFile{key: key, file: f}
				s.mu.Unlock()
			}
		}
		seen[path] = true
		out = append(out, Session{File: f, Path: filepath.Join(canonDir, name), Live: s.Proc.Alive(f.PID, procStart(f.ProcStart))})
	}
	return out, incomplete
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
