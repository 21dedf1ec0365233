// Package config turns `xmsg serve` flags and their XMSG_* environment fallbacks into an
// immutable Config. Precedence: flag, then environment, then default. Secrets never come
// from here: credential files are named by path (or found in $CREDENTIALS_DIRECTORY) and read
// by package creds.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config is the daemon's configuration.
type Config struct {
	HTTPSock, AgentSock, RegisterSock string // "" = default under $XDG_RUNTIME_DIR/xmsg
	Listen                            string // optional TCP HTTP listener
	HostLabel                         string
	SessionsDirs                      []string
	MaxBody                           int
	DBPath                            string
	ReplyTTL, IdempotencyTTL          time.Duration
	SvcExe                            map[string]string
	PeersFile, FedListen              string
	FedCert, FedKey, FedCA            string
	AgentMaxLine, AgentMaxConns       int
	AgentIdleTimeout                  time.Duration
	AgentWriteTimeout                 time.Duration
	RequireLandlock                   bool
	LogLevel                          string
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// option describes one flag for both parsing and --help.
type option struct {
	name, env, def, usage string
}

var options = []option{
	{"http-sock", "XMSG_HTTP_SOCK", "$XDG_RUNTIME_DIR/xmsg/http.sock", "HTTP API socket path (ignored under socket activation)"},
	{"agent-sock", "XMSG_AGENT_SOCK", "$XDG_RUNTIME_DIR/xmsg/agent.sock", "attested JSON-lines socket path"},
	{"register-sock", "XMSG_REGISTER_SOCK", "$XDG_RUNTIME_DIR/xmsg/register.sock", "registration socket path"},
	{"listen", "XMSG_LISTEN", "none", "optional TCP HTTP listener IP:PORT (no peer check; loopback/pod use only)"},
	{"host-label", "XMSG_HOST_LABEL", "hostname", "host label in sender badges and id@host refs"},
	{"sessions-dir", "XMSG_SESSIONS_DIR", "~/.claude/sessions", "Claude session directory (repeatable, ':'-separated lists)"},
	{"max-body", "XMSG_MAX_BODY", "65536", "maximum message body in bytes"},
	{"db-path", "XMSG_DB_PATH", "$STATE_DIRECTORY/xmsg.db, else $XDG_STATE_HOME/xmsg/xmsg.db", "bbolt database file"},
	{"reply-ttl", "XMSG_REPLY_TTL", "604800", "retention of messages, replies and queues, in seconds"},
	{"idempotency-ttl", "XMSG_IDEMPOTENCY_TTL", "86400", "retention of idempotency keys, in seconds"},
	{"svc-exe", "XMSG_SVC_EXE", "none", "trusted service executable NAME=PATH (repeatable, ',' lists)"},
	{"peers-file", "XMSG_PEERS_FILE", "none", "federation peers JSON (prefer LoadCredential=peers)"},
	{"fed-listen", "XMSG_FED_LISTEN", "none", "federation mTLS listener IP:PORT (not available in this build)"},
	{"fed-cert", "XMSG_FED_CERT", "none", "federation certificate PEM path (prefer LoadCredential=fed-cert)"},
	{"fed-key", "XMSG_FED_KEY", "none", "federation key PEM path (prefer LoadCredential=fed-key)"},
	{"fed-ca", "XMSG_FED_CA", "none", "federation CA bundle PEM path (prefer LoadCredential=fed-ca)"},
	{"agent-max-line", "XMSG_AGENT_MAX_LINE", "1048576", "agent.sock maximum line length in bytes"},
	{"agent-max-conns", "XMSG_AGENT_MAX_CONNS", "32", "agent.sock concurrent connections (the next is closed)"},
	{"agent-idle-timeout", "XMSG_AGENT_IDLE_TIMEOUT", "60s", "agent.sock idle connections are closed after this"},
	{"agent-write-timeout", "XMSG_AGENT_WRITE_TIMEOUT", "10s", "agent.sock writes the client does not read are abandoned after this"},
	{"require-landlock", "XMSG_REQUIRE_LANDLOCK", "false", "refuse to start unless Landlock enforces filesystem, network and scoping"},
	{"log-level", "XMSG_LOG_LEVEL", "info", "debug, info, warn or error"},
}

// Usage writes the help text: every flag with its environment variable and default.
func Usage(w io.Writer) {
	fmt.Fprint(w, "usage: xmsg serve [flags]\n\nRuns the bus. Every flag falls back to its environment variable, then its default.\n\n")
	for _, o := range options {
		fmt.Fprintf(w, "  --%-20s %s\n  %22s env %s, default %s\n", o.name, o.usage, "", o.env, o.def)
	}
}

// Parse parses args (without the subcommand) with env as the environment lookup.
func Parse(args []string, getenv func(string) string) (*Config, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	vals := map[string]*string{}
	var sessions, svc stringList
	for _, o := range options {
		switch o.name {
		case "sessions-dir":
			fs.Var(&sessions, o.name, o.usage)
		case "svc-exe":
			fs.Var(&svc, o.name, o.usage)
		case "require-landlock":
			vals[o.name] = new(string)
			fs.BoolFunc(o.name, o.usage, func(s string) error { *vals["require-landlock"] = s; return nil })
		default:
			vals[o.name] = fs.String(o.name, "", o.usage)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("config: %w (see xmsg serve --help)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("config: unexpected argument %q", fs.Arg(0))
	}
	get := func(name string) string {
		if v := *vals[name]; v != "" {
			return v
		}
		for _, o := range options {
			if o.name == name {
				return getenv(o.env)
			}
		}
		return ""
	}
	c := &Config{
		HTTPSock: get("http-sock"), AgentSock: get("agent-sock"), RegisterSock: get("register-sock"),
		Listen: get("listen"), HostLabel: get("host-label"), DBPath: get("db-path"),
		PeersFile: get("peers-file"), FedListen: get("fed-listen"),
		FedCert: get("fed-cert"), FedKey: get("fed-key"), FedCA: get("fed-ca"),
		LogLevel: or(get("log-level"), "info"),
	}
	var err error
	ints := []struct {
		name string
		def  int
		dst  *int
		min  int
	}{{"max-body", 65536, &c.MaxBody, 1}, {"agent-max-line", 1 << 20, &c.AgentMaxLine, 1024}, {"agent-max-conns", 32, &c.AgentMaxConns, 1}}
	for _, i := range ints {
		if *i.dst, err = intValue(i.name, get(i.name), i.def, i.min); err != nil {
			return nil, err
		}
	}
	secs := []struct {
		name string
		def  int
		dst  *time.Duration
	}{{"reply-ttl", 604800, &c.ReplyTTL}, {"idempotency-ttl", 86400, &c.IdempotencyTTL}}
	for _, s := range secs {
		n, err := intValue(s.name, get(s.name), s.def, 1)
		if err != nil {
			return nil, err
		}
		*s.dst = time.Duration(n) * time.Second
	}
	durs := []struct {
		name string
		def  time.Duration
		dst  *time.Duration
	}{{"agent-idle-timeout", 60 * time.Second, &c.AgentIdleTimeout}, {"agent-write-timeout", 10 * time.Second, &c.AgentWriteTimeout}}
	for _, d := range durs {
		if *d.dst, err = durationValue(d.name, get(d.name), d.def); err != nil {
			return nil, err
		}
	}
	if v := get("require-landlock"); v != "" {
		if c.RequireLandlock, err = strconv.ParseBool(v); err != nil {
			return nil, fmt.Errorf("config: --require-landlock: %q is not a boolean", v)
		}
	}
	if c.HostLabel == "" {
		if c.HostLabel, err = os.Hostname(); err != nil || c.HostLabel == "" {
			c.HostLabel = "localhost"
		}
	}
	if c.SessionsDirs, err = sessionDirs(sessions, getenv); err != nil {
		return nil, err
	}
	if len(svc) == 0 && getenv("XMSG_SVC_EXE") != "" {
		svc = stringList{getenv("XMSG_SVC_EXE")}
	}
	if c.SvcExe, err = svcExe(svc); err != nil {
		return nil, err
	}
	if c.DBPath, err = dbPath(c.DBPath, getenv); err != nil {
		return nil, err
	}
	if c.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			return nil, fmt.Errorf("config: --listen %q: want IP:PORT", c.Listen)
		}
	}
	if c.FedListen != "" {
		return nil, errors.New("config: --fed-listen: the federation listener is not available in this build")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return nil, fmt.Errorf("config: --log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	return c, nil
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func intValue(name, v string, def, min int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		return 0, fmt.Errorf("config: --%s: %q is not an integer >= %d", name, v, min)
	}
	return n, nil
}

func durationValue(name, v string, def time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		// Bare numbers are seconds, like the TTL flags.
		n, err2 := strconv.Atoi(v)
		if err2 != nil {
			return 0, fmt.Errorf("config: --%s: %q is not a duration (e.g. 60s)", name, v)
		}
		d = time.Duration(n) * time.Second
	}
	if d <= 0 {
		return 0, fmt.Errorf("config: --%s: must be positive", name)
	}
	return d, nil
}

func home(getenv func(string) string) string {
	if h := getenv("HOME"); h != "" {
		return h
	}
	h, _ := os.UserHomeDir()
	return h
}

func expand(p string, getenv func(string) string) string {
	if p == "~" {
		return home(getenv)
	}
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		return filepath.Join(home(getenv), rest)
	}
	return p
}

func sessionDirs(flags []string, getenv func(string) string) ([]string, error) {
	var raw []string
	for _, f := range flags {
		raw = append(raw, strings.Split(f, ":")...)
	}
	if len(raw) == 0 {
		for _, env := range []string{"XMSG_SESSIONS_DIR", "XMSG_SESSIONS_DIRS"} {
			if v := getenv(env); v != "" {
				raw = append(raw, strings.Split(v, ":")...)
			}
		}
	}
	if len(raw) == 0 {
		raw = []string{"~/.claude/sessions"}
	}
	seen := map[string]bool{}
	var out []string
	for _, d := range raw {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		d = filepath.Clean(expand(d, getenv))
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("config: --sessions-dir %q must be absolute", d)
		}
		key := d
		if canon, err := filepath.EvalSymlinks(d); err == nil {
			key = canon
		}
		if !seen[key] {
			seen[key] = true
			out = append(out, d)
		}
	}
	return out, nil
}

func svcExe(values []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			item = strings.TrimSpace(item)
			name, path, ok := strings.Cut(item, "=")
			if !ok {
				continue // PROTOCOL.md §7.1: entries without '=' are ignored
			}
			name = strings.TrimPrefix(strings.TrimSpace(name), "svc:")
			path = strings.TrimSpace(path)
			if name == "" || !filepath.IsAbs(path) {
				return nil, fmt.Errorf("config: --svc-exe %q: want NAME=/absolute/path", item)
			}
			out[name] = path
		}
	}
	return out, nil
}

func dbPath(p string, getenv func(string) string) (string, error) {
	if p != "" {
		return filepath.Clean(expand(p, getenv)), nil
	}
	// Under systemd, StateDirectory= hands us the state dir (possibly a ':' list; use the first).
	if sd := getenv("STATE_DIRECTORY"); sd != "" {
		return filepath.Join(strings.Split(sd, ":")[0], "xmsg.db"), nil
	}
	if x := getenv("XDG_STATE_HOME"); x != "" {
		return filepath.Join(x, "xmsg", "xmsg.db"), nil
	}
	h := home(getenv)
	if h == "" {
		return "", errors.New("config: no --db-path, $STATE_DIRECTORY, $XDG_STATE_HOME or $HOME")
	}
	return filepath.Join(h, ".local", "state", "xmsg", "xmsg.db"), nil
}

// SvcNames returns the configured service names, sorted (for logs).
func (c *Config) SvcNames() []string {
	var n []string
	for k := range c.SvcExe {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}
