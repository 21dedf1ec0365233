// Package activation acquires the daemon's three listening Unix sockets
// (http.sock, agent.sock, register.sock).
//
// There are exactly two ways to get them, chosen by [Acquire]:
//
//   - Socket activation. When systemd started us with LISTEN_FDS (and
//     LISTEN_PID names this process), the sockets arrive pre-bound. They are
//     looked up by their FileDescriptorName= (http, agent, register), never by
//     position, because systemd does not promise an fd order across units.
//     Every inherited fd is verified before it is used: AF_UNIX, SOCK_STREAM,
//     listening, bound to a socket file owned by our euid with mode 0600 in a
//     directory owned by our euid with mode 0700 that is not a symlink. An
//     unknown or duplicate name, or any fd that fails a check, refuses the
//     start with an error naming the fd. Nothing is bound in this mode.
//
//   - Self-binding (no systemd, e.g. a laptop). Each socket is bound by
//     [Bind] in a directory that [EnsureDir] created or verified (owner, mode
//     0700, not a symlink), under umask 0177 so the socket file is never
//     wider than 0600, not even between bind and a chmod. A live server on a
//     path refuses the start; a stale socket file is replaced; anything that
//     is not a socket is left alone and refuses the start.
//
// The directory and mode checks are the first of three independent barriers
// between tiers (directory mode, socket mode, peer uid check); each must hold
// on its own, so each fails closed here.
package activation

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// Socket names: the FileDescriptorName= of each systemd socket unit and the
// base name of each self-bound socket file.
const (
	NameHTTP     = "http"
	NameAgent    = "agent"
	NameRegister = "register"
)

// ErrInsecureSocketDir is wrapped by every error about the socket directory
// (docs/protocol.md §2.1 calls this startup error insecure_socket_dir).
var ErrInsecureSocketDir = errors.New("insecure_socket_dir")

// Paths are the socket file paths used when self-binding. Each must be
// absolute. An empty path means "do not serve this socket" (e.g. no
// http.sock in leaf mode); it is then reported in [Sockets.Missing].
type Paths struct {
	HTTP, Agent, Register string
}

// Sockets are the acquired listeners.
type Sockets struct {
	// HTTP, Agent and Register are nil when not provided: systemd did not
	// pass that name, or its self-bind path was empty.
	HTTP, Agent, Register net.Listener
	// Activated is true when the listeners came from systemd (LISTEN_FDS).
	Activated bool
	// Missing lists the names (http, agent, register) that have no
	// listener, so that the daemon can log that they are not served.
	Missing []string
	// HandedOver is set when the sockets came by LISTEN_FDS from the daemon
	// this one replaced (internal/relaunch), not from systemd: it says why
	// ($XMSG_HANDOVER). They are then this process's own, as if it had bound
	// them: Activated is false and Close removes their files.
	HandedOver string
}

// EnvHandover is set by the relaunch helper beside LISTEN_FDS: the sockets
// are the previous daemon's own, passed on (the reason is its value).
const EnvHandover = "XMSG_HANDOVER"

// DefaultDir returns the socket directory, $XDG_RUNTIME_DIR/xmsg. It does not
// create or check it (see [EnsureDir]). When XDG_RUNTIME_DIR is unset or
// blank it fails (wrapping [ErrInsecureSocketDir]) rather than falling back
// to a shared directory such as /tmp, where another user could have planted
// the directory first; on macOS it falls back to the per-user Darwin temp
// dir as docs/protocol.md §2.1 says.
func DefaultDir() (string, error) {
	if d := strings.TrimSpace(os.Getenv("XDG_RUNTIME_DIR")); d != "" {
		return filepath.Join(d, "xmsg"), nil
	}
	if d := fallbackRuntimeDir(); d != "" {
		return filepath.Join(d, "xmsg"), nil
	}
	return "", fmt.Errorf("activation: %w: XDG_RUNTIME_DIR is not set", ErrInsecureSocketDir)
}

// DefaultPaths returns the default socket paths: <DefaultDir>/{http,agent,register}.sock.
func DefaultPaths() (Paths, error) {
	dir, err := DefaultDir()
	if err != nil {
		return Paths{}, err
	}
	return Paths{
		HTTP:     filepath.Join(dir, NameHTTP+".sock"),
		Agent:    filepath.Join(dir, NameAgent+".sock"),
		Register: filepath.Join(dir, NameRegister+".sock"),
	}, nil
}

// DefaultPath returns the default path of one socket (NameHTTP, NameAgent or NameRegister):
// the one the daemon binds when it binds its own, so the CLI and the MCP bridge, which call
// this too, find the daemon wherever it runs (on macOS without XDG_RUNTIME_DIR as well).
func DefaultPath(name string) (string, error) {
	dir, err := DefaultDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, name+".sock"), nil
}

// ResolvePaths returns p with every empty path set to its default. Under socket activation
// the paths are not used, so a missing default directory is then no error (unless
// LISTEN_PID names another process: then Acquire falls back to binding and refuses the
// empty paths itself).
func ResolvePaths(p Paths) (Paths, error) {
	if p.HTTP != "" && p.Agent != "" && p.Register != "" {
		return p, nil
	}
	def, err := DefaultPaths()
	if err != nil {
		if os.Getenv("LISTEN_FDS") != "" {
			return p, nil
		}
		return p, err
	}
	for _, f := range []struct {
		dst *string
		def string
	}{{&p.HTTP, def.HTTP}, {&p.Agent, def.Agent}, {&p.Register, def.Register}} {
		if *f.dst == "" {
			*f.dst = f.def
		}
	}
	return p, nil
}

// Acquire returns the three listeners. Outcomes:
//
//   - LISTEN_FDS set and LISTEN_PID equal to our pid: the inherited fds,
//     verified (see the package doc), Activated true, Missing naming any
//     socket systemd did not pass; p is ignored and nothing is bound. Any
//     failed check is an error and every inherited fd is closed.
//   - LISTEN_FDS unset, or LISTEN_PID naming another process (the variables
//     were inherited from a parent and the fds are not ours, as in
//     sd_listen_fds(3)): each non-empty path of p is self-bound with [Bind].
//     On error, whatever was bound is closed again (and its file removed).
//
// In both cases the LISTEN_* variables are removed from the environment so
// that child processes do not mistake our fds for theirs.
func Acquire(p Paths) (*Sockets, error) {
	if _, ok := os.LookupEnv("LISTEN_FDS"); ok {
		s, err := inherit()
		if err != nil || s != nil {
			return s, err
		}
	}
	return bindAll(p)
}

func bindAll(p Paths) (*Sockets, error) {
	s := &Sockets{}
	for _, b := range []struct {
		name, path string
		dst        *net.Listener
	}{
		{NameHTTP, p.HTTP, &s.HTTP},
		{NameAgent, p.Agent, &s.Agent},
		{NameRegister, p.Register, &s.Register},
	} {
		if b.path == "" {
			s.Missing = append(s.Missing, b.name)
			continue
		}
		l, err := Bind(b.path)
		if err != nil {
			_ = s.Close()
			return nil, err
		}
		*b.dst = l
	}
	return s, nil
}

// Close closes every listener. Self-bound listeners remove their socket
// files; inherited ones never do (the socket unit owns those paths).
func (s *Sockets) Close() error {
	if s == nil {
		return nil
	}
	var errs []error
	for _, l := range []net.Listener{s.HTTP, s.Agent, s.Register} {
		if l != nil {
			// A listener its server already closed at shutdown is the normal case of a clean
			// stop, not an error to warn about; any other close error still is.
			if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("activation: close: %w", err)
	}
	return nil
}
