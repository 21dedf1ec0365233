// Package custody holds the daemon's named secrets and hands each one, as a sealed read-only
// memfd passed by SCM_RIGHTS, only to the services its policy names (docs/security.md §11).
//
// A secret arrives as the daemon's other credentials do (package creds): systemd's
// LoadCredential=custody-<name>, else a plain file named by --custody-file NAME=PATH, with the
// same checks (owner, mode, ACL, size, no symlink but the kubelet layout). It is read before
// the sandbox, copied into a memfd sealed against every change (F_SEAL_WRITE, F_SEAL_GROW,
// F_SEAL_SHRINK, F_SEAL_SEAL), and the read buffer is zeroed: from then on the bytes live in
// that memfd only. Nothing else the daemon keeps names more than the secret's name and its pin
// (a SHA-256 prefix): not the store, a log line, an error, argv, the environment or doctor.
//
// Policy: each secret names the services that may receive it (svc:<name>). A hand-over is
// made only to a process the caller has attributed to such a service, and custody attests
// that service's executable again itself (its canonical /proc/<pid>/exe must be the trusted
// --svc-exe path, now, not at registration): a service that exec'd another program, a leaf's
// uid-only service, a Claude session, an unattested process and a federation peer get
// nothing. Another uid never reaches the sockets (the peer gate).
//
// Every hand-over and every refusal is one rate-limited log line (secret name, pin prefix,
// principal, pid); doctor shows each secret's name, pin, who may have it and how often it
// was handed over.
package custody

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/xmsg/xmsg/internal/creds"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/ratelog"
)

// CredPrefix is the prefix of a secret's name in $CREDENTIALS_DIRECTORY:
// LoadCredential=custody-<name>:<file>.
const CredPrefix = "custody-"

// Secret is one secret's configuration.
type Secret struct {
	Name  string   // [A-Za-z0-9._-], at most 64 bytes
	File  string   // fallback plain file (--custody-file); "" = $CREDENTIALS_DIRECTORY only
	Allow []string // service names (without "svc:") that may receive it
}

// Config of a Holder.
type Config struct {
	Secrets []Secret
	// SvcExe are the trusted service executables (--svc-exe); Exe reads a process's
	// executable (the exehelper's under Landlock). A service without an entry is never
	// handed anything.
	SvcExe map[string]string
	Exe    func(pid int) (string, error)
	Log    *slog.Logger
}

// Holder holds the secrets. Safe for concurrent use; a nil Holder holds nothing.
type Holder struct {
	cfg Config
	lim ratelog.Limiter

	reloadMu sync.Mutex // one reload at a time
	mu       sync.RWMutex
	secrets  map[string]*secret

	tallyMu sync.Mutex
	tally   map[Tally]uint64 // hand-overs and refusals, for metrics (Tallies)
}

// Tally is one counted kind of hand-over: a secret's name (a held one, else "unknown": bounded
// by the configuration) and the refusal's code ("" for a secret handed over).
type Tally struct {
	Secret, Code string
}

// Tallies are the hand-overs and refusals counted so far.
func (h *Holder) Tallies() map[Tally]uint64 {
	if h == nil {
		return nil
	}
	h.tallyMu.Lock()
	defer h.tallyMu.Unlock()
	out := make(map[Tally]uint64, len(h.tally))
	for k, v := range h.tally {
		out[k] = v
	}
	return out
}

type secret struct {
	name   string
	allow  []string
	source creds.Source
	handed atomic.Int64 // hand-overs since start, across rotations (kept by Reload)

	mu  sync.RWMutex // guards f and pin (a rotation swaps them)
	f   *os.File     // the sealed memfd; reopened read-only for each hand-over
	pin string
}

// Error is a refusal with the protocol's code (docs/protocol.md §4.2): not_found, op_denied,
// unattested, internal. Its detail never holds a secret's content.
type Error struct {
	Code   ledger.Code
	Detail string
}

func (e *Error) Error() string { return "custody: " + e.Code.String() + ": " + e.Detail }

// ValidName reports whether name may name a secret: a credential file name that is the same
// in every layer it passes (flag, LoadCredential=, the NixOS module, a JSON frame).
func ValidName(name string) bool {
	if name == "" || len(name) > 64 || name == "." || name == ".." {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// Load reads every secret (before the sandbox) and seals each in its memfd. A secret
// configured with no source (no $CREDENTIALS_DIRECTORY/custody-<name>, no file) or one that
// fails a check is an error: a deployment that forgot a secret fails at start. Errors name
// the secret, never its content.
func Load(cfg Config) (*Holder, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	h := &Holder{cfg: cfg, secrets: map[string]*secret{}}
	for _, s := range cfg.Secrets {
		if !ValidName(s.Name) {
			h.Close()
			return nil, fmt.Errorf("custody: invalid secret name %q", s.Name)
		}
		if _, dup := h.secrets[s.Name]; dup {
			h.Close()
			return nil, fmt.Errorf("custody: secret %s configured twice", s.Name)
		}
		if len(s.Allow) == 0 {
			h.Close()
			return nil, fmt.Errorf("custody: secret %s: no principal may receive it (--custody %s=svc:NAME)", s.Name, s.Name)
		}
		f, pin, src, err := read(s)
		if err != nil {
			h.Close()
			return nil, err
		}
		sec := &secret{name: s.Name, allow: append([]string(nil), s.Allow...), source: src, f: f, pin: pin}
		h.secrets[s.Name] = sec
		cfg.Log.Info("custody secret loaded", "secret", s.Name, "pin", pin, "source", string(src), "allow", principals(sec.allow))
	}
	return h, nil
}

// read reads one secret through creds (every check of that package), seals it and zeroes
// the read buffer.
func read(s Secret) (*os.File, string, creds.Source, error) {
	b, src, err := creds.Read(CredPrefix+s.Name, s.File)
	defer clear(b) // the only other copy of the bytes (creds reads into one buffer)
	if err != nil {
		return nil, "", src, fmt.Errorf("custody: secret %s: %w", s.Name, err)
	}
	if b == nil {
		return nil, "", src, fmt.Errorf("custody: secret %s: no $CREDENTIALS_DIRECTORY/%s%s and no --custody-file", s.Name, CredPrefix, s.Name)
	}
	if len(b) == 0 {
		return nil, "", src, fmt.Errorf("custody: secret %s is empty", s.Name)
	}
	f, err := seal(s.Name, b)
	if err != nil {
		return nil, "", src, fmt.Errorf("custody: secret %s: %w", s.Name, err)
	}
	return f, Pin(b), src, nil
}

// Pin is the secret's public fingerprint: "sha256:" and the first 16 hex digits of its
// SHA-256. It tells a rotation apart and lets an operator match a file to what the daemon
// holds; 64 bits of a hash do not give back a high-entropy secret (a guessable one could be
// confirmed by a guess: docs/security.md §11).
func Pin(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// Reload reads every secret again; a secret whose content changed is swapped in (later
// hand-overs get the new one; fds already handed over keep the old). A secret that now fails
// to read is logged by name and the held one kept. It reports how many were rotated.
func (h *Holder) Reload() int {
	if h == nil {
		return 0
	}
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	n := 0
	for _, s := range h.cfg.Secrets {
		sec := h.get(s.Name)
		if sec == nil {
			continue
		}
		f, pin, src, err := read(s)
		if err != nil {
			h.cfg.Log.Error("custody reload refused; keeping the held secret", "secret", s.Name, "pin", sec.currentPin(), "err", err)
			continue
		}
		sec.mu.Lock()
		if pin == sec.pin {
			sec.mu.Unlock()
			f.Close()
			continue
		}
		old, oldPin := sec.f, sec.pin
		sec.f, sec.pin, sec.source = f, pin, src
		sec.mu.Unlock()
		old.Close()
		n++
		h.cfg.Log.Info("custody secret rotated", "secret", s.Name, "pin", pin, "previous_pin", oldPin)
	}
	return n
}

func (h *Holder) get(name string) *secret {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.secrets[name]
}

func (s *secret) currentPin() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pin
}

// Principal is who asks: a service (svc:<Service>) whose registered process is PID, asking
// itself (Via 0, register.sock) or through a descendant (Via its pid, agent.sock).
type Principal struct {
	Service string // "" for anything that is not a service: refused
	Actor   string // the caller's audit name (svc:a, claude:alice, pid:123)
	PID     int    // the service's process, whose executable is attested again
	Via     int    // the descendant that asked on agent.sock; 0 = the service itself
	// Alive reports whether PID (and Via) are still the processes the caller attested: the
	// executable is read by pid, so a pid reused meanwhile must not pass. nil: not checked.
	Alive func() bool
}

// Grant is what a hand-over's answer may say: the name and the pin, never the value.
type Grant struct {
	Name string `json:"name"`
	Pin  string `json:"pin"`
}

// Give hands secret name to p: a new read-only open file of the sealed memfd (O_CLOEXEC),
// which the caller passes by SCM_RIGHTS and then closes. Refusals (*Error):
//
//   - op_denied: p is not a service, or the secret's policy does not name p's service;
//   - unattested: p's process does not run the service's trusted executable now;
//   - not_found: no secret of that name is held (asked by a service only);
//   - internal: the memfd could not be reopened.
//
// Each outcome is one audit line.
func (h *Holder) Give(name string, p Principal) (*os.File, Grant, error) {
	if p.Service == "" {
		// A Claude session, a uid-only session, an unattested process: custody hands
		// secrets to services only, whatever the name.
		return nil, Grant{}, h.refuse(name, "", p, ledger.OpDenied, "only an attested service may receive a secret")
	}
	var sec *secret
	if h != nil {
		sec = h.get(name)
	}
	if sec == nil {
		return nil, Grant{}, h.refuse(name, "", p, ledger.NotFound, fmt.Sprintf("no secret '%s' is held", name))
	}
	pin := sec.currentPin()
	if !allowed(sec.allow, p.Service) {
		return nil, Grant{}, h.refuse(name, pin, p, ledger.OpDenied, fmt.Sprintf("secret '%s' is not for svc:%s", name, p.Service))
	}
	if err := h.attest(p); err != nil {
		return nil, Grant{}, h.refuse(name, pin, p, ledger.Unattested, err.Error())
	}
	if p.Alive != nil && !p.Alive() {
		return nil, Grant{}, h.refuse(name, pin, p, ledger.Unattested, fmt.Sprintf("process %d exited or was replaced", p.PID))
	}
	sec.mu.RLock()
	f, err := reopen(sec.f)
	pin = sec.pin
	sec.mu.RUnlock()
	if err != nil {
		return nil, Grant{}, h.refuse(name, pin, p, ledger.Internal, "secret could not be opened")
	}
	sec.handed.Add(1)
	h.audit(slog.LevelInfo, "custody handed over", name, pin, p, "")
	return f, Grant{Name: name, Pin: pin}, nil
}

// attest checks that p's service process runs the service's trusted executable now: the
// bus attested it at registration, but a process can exec another program and keep its pid
// and start time. Fails closed when either side cannot be read.
func (h *Holder) attest(p Principal) error {
	if h.cfg.Exe == nil {
		return errors.New("no executable attestation available")
	}
	trusted, ok := h.cfg.SvcExe[p.Service]
	if !ok {
		return fmt.Errorf("no trusted executable configured for service '%s'", p.Service)
	}
	want, err1 := peercred.Canonical(trusted)
	got, err2 := h.cfg.Exe(p.PID)
	if err1 != nil || err2 != nil || got != want {
		return fmt.Errorf("process %d does not run the trusted executable of service '%s'", p.PID, p.Service)
	}
	return nil
}

func allowed(allow []string, svc string) bool {
	for _, a := range allow {
		if a == svc {
			return true
		}
	}
	return false
}

// Unattested is the refusal of a caller attested to nobody (agent.sock's walk found no
// session): custody's audit line and error, code unattested.
func (h *Holder) Unattested(name string, p Principal, detail string) error {
	return h.refuse(name, "", p, ledger.Unattested, detail)
}

func (h *Holder) refuse(name, pin string, p Principal, code ledger.Code, detail string) error {
	h.audit(slog.LevelWarn, "custody refused", name, pin, p, code.String())
	return &Error{Code: code, Detail: detail}
}

// audit writes one line per hand-over or refusal, at most one a second per (outcome, secret,
// code) with the count of the others. The secret name is the operator's (an unknown name a
// client sent is logged only as "unknown" and keyed once, so it cannot grow the limiter or
// write the client's text into the journal).
func (h *Holder) audit(level slog.Level, msg, name, pin string, p Principal, code string) {
	if h == nil {
		return
	}
	logged := name
	if h.get(name) == nil {
		logged = "unknown"
	}
	h.tallyMu.Lock()
	if h.tally == nil {
		h.tally = map[Tally]uint64{}
	}
	h.tally[Tally{Secret: logged, Code: code}]++
	h.tallyMu.Unlock()
	args := []any{"secret", logged, "actor", p.Actor, "peer_pid", p.PID}
	if pin != "" {
		args = append(args, "pin", pin)
	}
	if p.Via != 0 {
		args = append(args, "via_pid", p.Via)
	}
	if code != "" {
		args = append(args, "code", code)
	}
	h.lim.Log(h.cfg.Log, level, msg+" "+logged+" "+code, msg, args...)
}

// Lines are doctor's lines: each secret's name, pin, who may have it and its hand-overs.
// Never the value.
func (h *Holder) Lines() []string {
	if h == nil || len(h.secrets) == 0 {
		return []string{"custody: no secrets held"}
	}
	h.mu.RLock()
	names := make([]string, 0, len(h.secrets))
	for n := range h.secrets {
		names = append(names, n)
	}
	h.mu.RUnlock()
	sort.Strings(names)
	var l []string
	for _, n := range names {
		s := h.get(n)
		s.mu.RLock()
		pin, src := s.pin, s.source
		s.mu.RUnlock()
		l = append(l, fmt.Sprintf("custody: %s pin %s from %s, for %s; handed over %d times", n, pin, src, principals(s.allow), s.handed.Load()))
	}
	return l
}

// Handed is how many times secret name was handed over (0 for an unknown name).
func (h *Holder) Handed(name string) int64 {
	if h == nil {
		return 0
	}
	if s := h.get(name); s != nil {
		return s.handed.Load()
	}
	return 0
}

// Close closes every memfd.
func (h *Holder) Close() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.secrets {
		s.mu.Lock()
		s.f.Close()
		s.mu.Unlock()
	}
	h.secrets = map[string]*secret{}
	return nil
}

func principals(allow []string) string {
	out := make([]string, len(allow))
	for i, a := range allow {
		out[i] = "svc:" + a
	}
	return strings.Join(out, ",")
}
