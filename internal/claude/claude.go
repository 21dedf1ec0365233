// Package claude discovers Claude Code sessions from their session files and delivers one
// message line to a session's inbox socket (PROTOCOL.md §5.1, §2.7).
//
// Session files are re-read on every call: Claude writes and removes them as sessions come and
// go, and a cache would answer with sessions that are gone. Files are opened without following
// symlinks and must be regular files owned by our euid, so another user (or a planted link)
// cannot point discovery at a socket of their choosing.
package claude

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

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
	// id is live in more than one directory (fork claims, PROTOCOL.md decisions table).
	ID   string
	Path string // canonical path of the session file
	Live bool   // pid alive and its start time equals procStart
}

// Start is the session's recorded process start time (the pid-reuse guard).
func (s Session) Start() string { return procStart(s.ProcStart) }

// Scanner reads the configured session directories.
type Scanner struct {
	Dirs []string
	Proc peercred.Proc
	UID  int // files must be owned by this uid
	Log  *slog.Logger
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

// Scan returns every readable session, live or not, with fork claims assigned.
func (s *Scanner) Scan() []Session {
	var out []Session
	for _, dir := range s.Dirs {
		out = append(out, s.scanDir(dir)...)
	}
	// Fork claims are deterministic: the first file by sorted canonical path keeps the id.
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	// Only live sessions take part: a stale file left by a dead session must not push the live
	// one off its own id.
	seen := map[string]int{}
	for i := range out {
		out[i].ID = out[i].SessionID
		if !out[i].Live {
			continue
		}
		key := strings.ToLower(out[i].SessionID)
		seen[key]++
		if n := seen[key]; n > 1 {
			out[i].ID = fmt.Sprintf("%s~%d", out[i].SessionID, n)
		}
	}
	return out
}

func (s *Scanner) scanDir(dir string) []Session {
	names, err := listDir(dir)
	if err != nil {
		if !os.IsNotExist(err) {
			s.Log.Warn("session dir unreadable", "dir", dir, "err", err)
		}
		return nil
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
		raw, err := readSessionFile(dir, name, s.UID)
		if err != nil {
			s.Log.Warn("session file skipped", "dir", dir, "file", name, "err", err)
			continue
		}
		var f File
		if err := json.Unmarshal(raw, &f); err != nil || f.SessionID == "" || f.PID <= 0 {
			s.Log.Warn("session file malformed", "dir", dir, "file", name)
			continue
		}
		out = append(out, Session{File: f, Path: filepath.Join(canonDir, name), Live: s.Proc.Alive(f.PID, procStart(f.ProcStart))})
	}
	return out
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
