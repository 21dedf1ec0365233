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
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/limits"
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
	FedReloadInterval                 time.Duration // 0 = no reload
	FedRatePeer, FedRatePrincipal     int           // token buckets per minute (burst the same)
	FedMaxConns                       int           // federation listener budget; 0 = from RLIMIT_NOFILE
	FedBodyTimeout                    time.Duration // federation request bodies, from the end of the headers
	AgentMaxLine, AgentMaxConns       int
	AgentIdleTimeout                  time.Duration
	AgentWriteTimeout                 time.Duration
	RequireLandlock                   bool
	LogLevel                          string
	CodexExe, CodexHome               []string // trusted Codex executables and Codex homes
	AgyExe                            []string // trusted Antigravity executables
	AgyPresenceDir                    string   // where agy conversations' presence locks live
	AgyBin                            string   // the agy program that runs agentapi; "" = first AgyExe
	// Leaf mode (docs/protocol.md §7.5): only http.sock (HTTPSock or its default), the TCP
	// listener if --listen is given, and LeafRegisterSock are served.
	Leaf             bool
	LeafPrincipal    string
	LeafRegisterSock string // "" = RegisterSock, else the default register.sock path
	// Custody are the secrets the daemon holds and who may receive each (custody.go).
	Custody               []custody.Secret
	CustodyReloadInterval time.Duration // 0 = no reload but on SIGHUP
	// Shares of what senders share (internal/limits): 0 = no bound.
	QueueMaxPerOrigin, LeafMailboxMax, LeafMailboxMaxBytes int
	// LeafListenNonLoopback lets a leaf's --listen take a non-loopback address: that listener
	// has no peer check, and whoever reaches it speaks as the leaf's principal.
	LeafListenNonLoopback bool
	Limits                Limits
}

// Limits are the fairness bounds of the sockets (docs/design.md §3): how many connections
// each socket serves, how many one peer pid may hold, and the deadline of each phase.
type Limits struct {
	AgentMaxPending, AgentMaxPerPID                     int
	AgentPendingTimeout                                 time.Duration
	RegisterMaxConns, RegisterMaxPending                int
	RegisterMaxPerPID, RegisterMaxUIDOnly               int
	RegisterFirstFrameTimeout, RegisterIdleTimeout      time.Duration
	HTTPMaxConns, HTTPMaxPerPID                         int
	HTTPMaxWaiters, HTTPMaxWaitersPerPID                int
	HTTPHeaderTimeout, HTTPBodyTimeout, HTTPIdleTimeout time.Duration
	// NoEvict turns off eviction (--evict-idle=false): a full pool then refuses the newest
	// connection instead of closing its oldest idle one. Only the attack tests' controls
	// want that.
	NoEvict bool
}

// option is one flag: its name, environment variable, default and how a value is stored.
// The table below is the only place a flag's default is written: parsing uses def as the
// value when neither the flag nor the environment gives one, and --help prints it. Where
// the default is worked out at run time (hostname, paths), def is "" and doc says what it is.
type option struct {
	name, env string
	def       string // in the flag's own syntax; "" = computed (see doc) or none
	doc       string // --help's text for the default when def is ""
	usage     string
	list      bool // repeatable; each value may itself be a list
	boolean   bool // --name alone means true
	set       func(c *Config, v string) error
}

func str(dst func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *dst(c) = v; return nil }
}

func integer(name string, min int, dst func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < min {
			return fmt.Errorf("config: --%s: %q is not an integer >= %d", name, v, min)
		}
		*dst(c) = n
		return nil
	}
}

// seconds is a whole number of seconds, like the protocol's TTL flags.
func seconds(name string, dst func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("config: --%s: %q is not an integer >= 1", name, v)
		}
		*dst(c) = time.Duration(n) * time.Second
		return nil
	}
}

// duration is a Go duration ("60s"); a bare number is seconds.
func duration(name string, dst func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			n, err2 := strconv.Atoi(v)
			if err2 != nil {
				return fmt.Errorf("config: --%s: %q is not a duration (e.g. 60s)", name, v)
			}
			d = time.Duration(n) * time.Second
		}
		if d <= 0 {
			return fmt.Errorf("config: --%s: must be positive", name)
		}
		*dst(c) = d
		return nil
	}
}

func secs(d time.Duration) string { return strconv.Itoa(int(d / time.Second)) }

var options = []option{
	{name: "http-sock", env: "XMSG_HTTP_SOCK", doc: "$XDG_RUNTIME_DIR/xmsg/http.sock", usage: "HTTP API socket path (ignored under socket activation)",
		set: str(func(c *Config) *string { return &c.HTTPSock })},
	{name: "agent-sock", env: "XMSG_AGENT_SOCK", doc: "$XDG_RUNTIME_DIR/xmsg/agent.sock", usage: "attested JSON-lines socket path",
		set: str(func(c *Config) *string { return &c.AgentSock })},
	{name: "register-sock", env: "XMSG_REGISTER_SOCK", doc: "$XDG_RUNTIME_DIR/xmsg/register.sock", usage: "registration socket path",
		set: str(func(c *Config) *string { return &c.RegisterSock })},
	{name: "listen", env: "XMSG_LISTEN", doc: "none", usage: "optional TCP HTTP listener IP:PORT (no peer check; loopback/pod use only)",
		set: func(c *Config, v string) error {
			if _, _, err := net.SplitHostPort(v); err != nil {
				return fmt.Errorf("config: --listen %q: want IP:PORT", v)
			}
			c.Listen = v
			return nil
		}},
	{name: "host-label", env: "XMSG_HOST_LABEL", doc: "the hostname", usage: "host label in sender badges and id@host refs",
		set: str(func(c *Config) *string { return &c.HostLabel })},
	{name: "sessions-dir", env: "XMSG_SESSIONS_DIR", def: "~/.claude/sessions", usage: "Claude session directory (repeatable, ':'-separated lists; XMSG_SESSIONS_DIRS is read too)", list: true},
	{name: "max-body", env: "XMSG_MAX_BODY", def: strconv.Itoa(limits.MaxBody), usage: "maximum message text in bytes (an HTTP request may be up to 6x this + 4096: the text JSON-escaped)",
		set: integer("max-body", 1, func(c *Config) *int { return &c.MaxBody })},
	{name: "db-path", env: "XMSG_DB_PATH", doc: "$STATE_DIRECTORY/xmsg.db, else $XDG_STATE_HOME/xmsg/xmsg.db, else ~/.local/state/xmsg/xmsg.db", usage: "bbolt database file",
		set: str(func(c *Config) *string { return &c.DBPath })},
	{name: "reply-ttl", env: "XMSG_REPLY_TTL", def: secs(limits.ReplyTTL), usage: "retention of messages, replies and queues, in seconds",
		set: seconds("reply-ttl", func(c *Config) *time.Duration { return &c.ReplyTTL })},
	{name: "idempotency-ttl", env: "XMSG_IDEMPOTENCY_TTL", def: secs(limits.IdempotencyTTL), usage: "retention of idempotency keys, in seconds",
		set: seconds("idempotency-ttl", func(c *Config) *time.Duration { return &c.IdempotencyTTL })},
	{name: "svc-exe", env: "XMSG_SVC_EXE", doc: "none", usage: "trusted service executable NAME=PATH (repeatable, ',' lists)", list: true},
	custodyOptions[0], custodyOptions[1], custodyOptions[2],
	{name: "agy-exe", env: "XMSG_AGY_EXE", doc: "none", usage: "trusted Antigravity executable PATH (repeatable, ',' lists; none = agy attestation always fails)", list: true},
	{name: "agy-presence-dir", env: "XMSG_AGY_PRESENCE_DIR", doc: "none", usage: "directory of agy presence locks <conversation_id>.lock (required with --agy-exe)",
		set: absPath("agy-presence-dir", func(c *Config) *string { return &c.AgyPresenceDir })},
	{name: "agy-bin", env: "XMSG_AGY_BIN", doc: "the first --agy-exe", usage: "agy program run as 'agy agentapi send-message' to deliver",
		set: absPath("agy-bin", func(c *Config) *string { return &c.AgyBin })},
	{name: "codex-exe", env: "XMSG_CODEX_EXE", doc: "none", usage: "trusted Codex executable PATH (repeatable, ',' lists; Linux)", list: true},
	{name: "codex-home", env: "XMSG_CODEX_HOME", doc: "none", usage: "Codex home whose thread-writer-locks attest Codex sessions (repeatable, ',' lists)", list: true},
	{name: "peers-file", env: "XMSG_PEERS_FILE", doc: "none", usage: "federation peers JSON (prefer LoadCredential=peers)",
		set: str(func(c *Config) *string { return &c.PeersFile })},
	{name: "fed-listen", env: "XMSG_FED_LISTEN", doc: "none", usage: "federation mTLS listener IP:PORT (an unspecified IP such as 0.0.0.0 is refused; needs a peers file, fed-cert and fed-key)",
		set: func(c *Config, v string) error {
			// docs/protocol.md §2.6: IP:PORT with a specified IP. That a peers file, cert and key
			// exist is checked when the credentials are read (they may come from
			// $CREDENTIALS_DIRECTORY rather than flags).
			ap, err := netip.ParseAddrPort(v)
			switch {
			case err != nil || ap.Port() == 0:
				return fmt.Errorf("config: --fed-listen %q: want IP:PORT", v)
			case ap.Addr().IsUnspecified():
				return fmt.Errorf("config: --fed-listen %q: an unspecified address (0.0.0.0, ::) is refused; name the address to listen on", v)
			}
			c.FedListen = v
			return nil
		}},
	{name: "fed-cert", env: "XMSG_FED_CERT", doc: "none", usage: "federation certificate PEM path (prefer LoadCredential=fed-cert)",
		set: str(func(c *Config) *string { return &c.FedCert })},
	{name: "fed-key", env: "XMSG_FED_KEY", doc: "none", usage: "federation key PEM path (prefer LoadCredential=fed-key)",
		set: str(func(c *Config) *string { return &c.FedKey })},
	{name: "fed-ca", env: "XMSG_FED_CA", doc: "none", usage: "federation CA bundle PEM path, the bundle a peer's \"ca\": \"fed-ca\" names (prefer LoadCredential=fed-ca)",
		set: str(func(c *Config) *string { return &c.FedCA })},
	{name: "fed-reload-interval-secs", env: "XMSG_FED_RELOAD_INTERVAL_SECS", def: "30", usage: "re-read federation cert, key, CA files and peers every N seconds (0 disables)",
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("config: --fed-reload-interval-secs: %q is not an integer >= 0", v)
			}
			c.FedReloadInterval = time.Duration(n) * time.Second
			return nil
		}},
	{name: "fed-rate-peer", env: "XMSG_FED_RATE_PEER", def: "60", usage: "federation requests per minute per peer (token bucket, burst the same)",
		set: integer("fed-rate-peer", 1, func(c *Config) *int { return &c.FedRatePeer })},
	{name: "fed-rate-principal", env: "XMSG_FED_RATE_PRINCIPAL", def: "20", usage: "federation requests per minute per (peer, sender principal) (token bucket, burst the same)",
		set: integer("fed-rate-principal", 1, func(c *Config) *int { return &c.FedRatePrincipal })},
	{name: "queue-max-per-origin", env: "XMSG_QUEUE_MAX_PER_ORIGIN", def: strconv.Itoa(limits.QueueMaxPerOrigin), usage: "places of one queue (of 100) one origin may hold: a federation peer or an attested local session; 0 = no bound but the queue's",
		set: integer("queue-max-per-origin", 0, func(c *Config) *int { return &c.QueueMaxPerOrigin })},
	{name: "leaf-mailbox-max", env: "XMSG_LEAF_MAILBOX_MAX", def: strconv.Itoa(limits.LeafMailboxMax), usage: "messages one leaf's mailbox on this hub may hold; 0 = no bound",
		set: integer("leaf-mailbox-max", 0, func(c *Config) *int { return &c.LeafMailboxMax })},
	{name: "leaf-mailbox-max-bytes", env: "XMSG_LEAF_MAILBOX_MAX_BYTES", def: strconv.Itoa(limits.LeafMailboxMaxBytes), usage: "stored bytes one leaf's mailbox on this hub may hold; 0 = no bound",
		set: integer("leaf-mailbox-max-bytes", 0, func(c *Config) *int { return &c.LeafMailboxMaxBytes })},
	{name: "fed-max-conns", env: "XMSG_FED_MAX_CONNS", def: "0", usage: "federation listener connections at once, pending and authenticated (0: sized from RLIMIT_NOFILE; more than it allows is lowered, with a warning)",
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || (n != 0 && n < 32) {
				return fmt.Errorf("config: --fed-max-conns: %q is not 0 or an integer >= 32", v)
			}
			c.FedMaxConns = n
			return nil
		}},
	{name: "fed-body-timeout", env: "XMSG_FED_BODY_TIMEOUT", def: "10s", usage: "federation request bodies must arrive within this, from the end of the headers",
		set: duration("fed-body-timeout", func(c *Config) *time.Duration { return &c.FedBodyTimeout })},
	{name: "agent-max-line", env: "XMSG_AGENT_MAX_LINE", def: strconv.Itoa(limits.AgentMaxLine), usage: "agent.sock maximum line length in bytes",
		set: integer("agent-max-line", 1024, func(c *Config) *int { return &c.AgentMaxLine })},
	{name: "agent-max-conns", env: "XMSG_AGENT_MAX_CONNS", def: strconv.Itoa(limits.AgentMaxConns), usage: "agent.sock connections served at once, counted once attested to a session",
		set: integer("agent-max-conns", 1, func(c *Config) *int { return &c.AgentMaxConns })},
	{name: "agent-idle-timeout", env: "XMSG_AGENT_IDLE_TIMEOUT", def: limits.AgentIdleTimeout.String(), usage: "agent.sock idle connections are closed after this",
		set: duration("agent-idle-timeout", func(c *Config) *time.Duration { return &c.AgentIdleTimeout })},
	{name: "agent-write-timeout", env: "XMSG_AGENT_WRITE_TIMEOUT", def: limits.AgentWriteTimeout.String(), usage: "agent.sock writes the client does not read are abandoned after this",
		set: duration("agent-write-timeout", func(c *Config) *time.Duration { return &c.AgentWriteTimeout })},
	{name: "agent-max-pending", env: "XMSG_AGENT_MAX_PENDING", def: strconv.Itoa(limits.AgentMaxPending), usage: "agent.sock connections not yet attested (the next evicts the oldest idle one)",
		set: integer("agent-max-pending", 1, func(c *Config) *int { return &c.Limits.AgentMaxPending })},
	{name: "agent-max-per-pid", env: "XMSG_AGENT_MAX_PER_PID", def: strconv.Itoa(limits.AgentMaxPerPID), usage: "agent.sock attested connections one process may hold",
		set: integer("agent-max-per-pid", 1, func(c *Config) *int { return &c.Limits.AgentMaxPerPID })},
	{name: "agent-pending-timeout", env: "XMSG_AGENT_PENDING_TIMEOUT", def: limits.AgentPendingTimeout.String(), usage: "agent.sock connections not attested this long after connect are closed",
		set: duration("agent-pending-timeout", func(c *Config) *time.Duration { return &c.Limits.AgentPendingTimeout })},
	{name: "register-max-conns", env: "XMSG_REGISTER_MAX_CONNS", def: strconv.Itoa(limits.RegisterMaxConns), usage: "register.sock registrations served at once",
		set: integer("register-max-conns", 1, func(c *Config) *int { return &c.Limits.RegisterMaxConns })},
	{name: "register-max-pending", env: "XMSG_REGISTER_MAX_PENDING", def: strconv.Itoa(limits.RegisterMaxPending), usage: "register.sock connections before their first frame (the next evicts the oldest idle one)",
		set: integer("register-max-pending", 1, func(c *Config) *int { return &c.Limits.RegisterMaxPending })},
	{name: "register-max-per-pid", env: "XMSG_REGISTER_MAX_PER_PID", def: strconv.Itoa(limits.RegisterMaxPerPID), usage: "register.sock registrations one process may hold",
		set: integer("register-max-per-pid", 1, func(c *Config) *int { return &c.Limits.RegisterMaxPerPID })},
	{name: "register-max-uid-only", env: "XMSG_REGISTER_MAX_UID_ONLY", def: strconv.Itoa(limits.RegisterMaxUIDOnly), usage: "register.sock uid-only registrations (pi, opencode, hermes, cli) at once",
		set: integer("register-max-uid-only", 1, func(c *Config) *int { return &c.Limits.RegisterMaxUIDOnly })},
	{name: "register-first-frame-timeout", env: "XMSG_REGISTER_FIRST_FRAME_TIMEOUT", def: limits.RegisterFirstFrameTimeout.String(), usage: "register.sock first frame deadline, from the connect",
		set: duration("register-first-frame-timeout", func(c *Config) *time.Duration { return &c.Limits.RegisterFirstFrameTimeout })},
	{name: "register-idle-timeout", env: "XMSG_REGISTER_IDLE_TIMEOUT", def: limits.RegisterIdleTimeout.String(), usage: "register.sock registrations sending no frame this long (beyond a poll's wait) are closed",
		set: duration("register-idle-timeout", func(c *Config) *time.Duration { return &c.Limits.RegisterIdleTimeout })},
	{name: "http-max-conns", env: "XMSG_HTTP_MAX_CONNS", def: strconv.Itoa(limits.HTTPMaxConns), usage: "http.sock connections at once (the next evicts the oldest idle one)",
		set: integer("http-max-conns", 1, func(c *Config) *int { return &c.Limits.HTTPMaxConns })},
	{name: "http-max-per-pid", env: "XMSG_HTTP_MAX_PER_PID", def: strconv.Itoa(limits.HTTPMaxPerPID), usage: "http.sock requests in progress of one process (of one connection on --listen)",
		set: integer("http-max-per-pid", 1, func(c *Config) *int { return &c.Limits.HTTPMaxPerPID })},
	{name: "http-max-waiters", env: "XMSG_HTTP_MAX_WAITERS", def: strconv.Itoa(limits.HTTPMaxWaiters), usage: "reply long-polls waiting at once (the next gets 503)",
		set: integer("http-max-waiters", 1, func(c *Config) *int { return &c.Limits.HTTPMaxWaiters })},
	{name: "http-max-waiters-per-pid", env: "XMSG_HTTP_MAX_WAITERS_PER_PID", def: strconv.Itoa(limits.HTTPMaxWaitersPerPID), usage: "reply long-polls one process may have waiting",
		set: integer("http-max-waiters-per-pid", 1, func(c *Config) *int { return &c.Limits.HTTPMaxWaitersPerPID })},
	{name: "http-header-timeout", env: "XMSG_HTTP_HEADER_TIMEOUT", def: limits.HTTPHeaderTimeout.String(), usage: "http.sock request headers must arrive within this",
		set: duration("http-header-timeout", func(c *Config) *time.Duration { return &c.Limits.HTTPHeaderTimeout })},
	{name: "http-body-timeout", env: "XMSG_HTTP_BODY_TIMEOUT", def: limits.HTTPBodyTimeout.String(), usage: "http.sock request bodies must arrive within this",
		set: duration("http-body-timeout", func(c *Config) *time.Duration { return &c.Limits.HTTPBodyTimeout })},
	{name: "http-idle-timeout", env: "XMSG_HTTP_IDLE_TIMEOUT", def: limits.HTTPIdleTimeout.String(), usage: "http.sock keep-alive connections idle this long are closed",
		set: duration("http-idle-timeout", func(c *Config) *time.Duration { return &c.Limits.HTTPIdleTimeout })},
	{name: "evict-idle", env: "XMSG_EVICT_IDLE", def: "true", usage: "a full pool (agent.sock and register.sock before attestation, idle keep-alives on http.sock and --listen) closes its oldest idle connection for a new one; false refuses the new one", boolean: true,
		set: func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("config: --evict-idle: %q is not a boolean", v)
			}
			c.Limits.NoEvict = !b
			return nil
		}},
	{name: "leaf", env: "XMSG_LEAF", def: "false", usage: "leaf mode: outbound-only, pulls its service's mail from the hubs of the peers file (needs --leaf-principal; its HTTP API is on http.sock, --listen adds TCP)", boolean: true,
		set: func(c *Config, v string) (err error) {
			if c.Leaf, err = strconv.ParseBool(v); err != nil {
				return fmt.Errorf("config: --leaf: %q is not a boolean", v)
			}
			return nil
		}},
	{name: "leaf-principal", env: "XMSG_LEAF_PRINCIPAL", doc: "none", usage: "leaf mode: principal of all leaf traffic, e.g. svc:matrix (its service is the one local registration)",
		set: str(func(c *Config) *string { return &c.LeafPrincipal })},
	{name: "leaf-register-sock", env: "XMSG_LEAF_REGISTER_SOCK", doc: "--register-sock, else $XDG_RUNTIME_DIR/xmsg/register.sock", usage: "leaf mode: the register socket of the leaf's service",
		set: str(func(c *Config) *string { return &c.LeafRegisterSock })},
	{name: "leaf-listen-non-loopback", env: "XMSG_LEAF_LISTEN_NON_LOOPBACK", def: "false", usage: "leaf mode: let --listen take a non-loopback address (that listener has no peer check: whoever reaches it sends as the leaf's principal)", boolean: true,
		set: func(c *Config, v string) (err error) {
			if c.LeafListenNonLoopback, err = strconv.ParseBool(v); err != nil {
				return fmt.Errorf("config: --leaf-listen-non-loopback: %q is not a boolean", v)
			}
			return nil
		}},
	{name: "require-landlock", env: "XMSG_REQUIRE_LANDLOCK", def: "false", usage: "refuse to start unless Landlock enforces filesystem, network and scoping", boolean: true,
		set: func(c *Config, v string) (err error) {
			if c.RequireLandlock, err = strconv.ParseBool(v); err != nil {
				return fmt.Errorf("config: --require-landlock: %q is not a boolean", v)
			}
			return nil
		}},
	{name: "log-level", env: "XMSG_LOG_LEVEL", def: "info", usage: "debug, info, warn or error",
		set: func(c *Config, v string) error {
			switch v {
			case "debug", "info", "warn", "error":
				c.LogLevel = v
				return nil
			}
			return fmt.Errorf("config: --log-level %q: want debug, info, warn or error", v)
		}},
}

// Flag is one flag of the table, as the CLI's completion and man page show it.
type Flag struct {
	Name, Env, Default, Usage string
	Boolean                   bool
}

// Flags is the table: every flag of `xmsg serve`, in its order.
func Flags() []Flag {
	out := make([]Flag, 0, len(options))
	for _, o := range options {
		def := o.def
		if def == "" {
			def = o.doc
		}
		out = append(out, Flag{Name: o.name, Env: o.env, Default: def, Usage: o.usage, Boolean: o.boolean})
	}
	return out
}

// Usage writes the help text: every flag with its environment variable and default.
func Usage(w io.Writer) {
	fmt.Fprint(w, "usage: xmsg serve [flags]\n\nRuns the bus. Every flag falls back to its environment variable, then its default.\n\n")
	for _, o := range options {
		def := o.def
		if def == "" {
			def = o.doc
		}
		fmt.Fprintf(w, "  --%-20s %s\n  %22s env %s, default %s\n", o.name, o.usage, "", o.env, def)
	}
}

// Parse parses args (without the subcommand) with env as the environment lookup.
func Parse(args []string, getenv func(string) string) (*Config, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	given := map[string][]string{}
	for _, o := range options {
		name := o.name
		add := func(v string) error { given[name] = append(given[name], v); return nil }
		if o.boolean {
			fs.BoolFunc(name, o.usage, func(v string) error {
				if v == "" {
					v = "true"
				}
				return add(v)
			})
		} else {
			fs.Func(name, o.usage, add)
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
	c := &Config{}
	for _, o := range options {
		if o.list {
			continue // below: lists merge several sources
		}
		v := ""
		if vs := given[o.name]; len(vs) > 0 {
			v = vs[len(vs)-1] // the last flag wins, as with the flag package
		}
		if v == "" {
			v = getenv(o.env)
		}
		if v == "" {
			v = o.def
		}
		if v == "" {
			continue
		}
		if err := o.set(c, v); err != nil {
			return nil, err
		}
	}
	var err error
	if c.HostLabel == "" {
		if c.HostLabel, err = os.Hostname(); err != nil || c.HostLabel == "" {
			c.HostLabel = "localhost"
		}
	}
	if c.SessionsDirs, err = sessionDirs(given["sessions-dir"], getenv); err != nil {
		return nil, err
	}
	svc := given["svc-exe"]
	if len(svc) == 0 && getenv("XMSG_SVC_EXE") != "" {
		svc = []string{getenv("XMSG_SVC_EXE")}
	}
	if c.SvcExe, err = svcExe(svc); err != nil {
		return nil, err
	}
	if c.DBPath, err = dbPath(c.DBPath, getenv); err != nil {
		return nil, err
	}
	if err := c.checkLeaf(); err != nil {
		return nil, err
	}
	if err := harnesses(c, given, getenv); err != nil {
		return nil, err
	}
	if err := custodySecrets(c, given, getenv); err != nil {
		return nil, err
	}
	return c, nil
}

// harnesses reads the Codex and Antigravity attestation flags, which only make sense
// together: an executable without its lock directory could attest nothing.
func harnesses(c *Config, given map[string][]string, getenv func(string) string) error {
	var err error
	for _, l := range []struct {
		name, env string
		dst       *[]string
	}{{"codex-exe", "XMSG_CODEX_EXE", &c.CodexExe}, {"codex-home", "XMSG_CODEX_HOME", &c.CodexHome}, {"agy-exe", "XMSG_AGY_EXE", &c.AgyExe}} {
		if *l.dst, err = pathList(l.name, given[l.name], getenv(l.env), getenv); err != nil {
			return err
		}
	}
	if (len(c.CodexExe) == 0) != (len(c.CodexHome) == 0) {
		return errors.New("config: --codex-exe and --codex-home must be given together")
	}
	if len(c.AgyExe) > 0 && c.AgyPresenceDir == "" {
		return errors.New("config: --agy-exe needs --agy-presence-dir")
	}
	if c.AgyBin == "" && len(c.AgyExe) > 0 {
		c.AgyBin = c.AgyExe[0]
	}
	return nil
}

// absPath stores one absolute path (a leading ~/ is expanded by the caller's HOME).
func absPath(name string, dst func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error {
		p := filepath.Clean(v)
		if !filepath.IsAbs(p) {
			return fmt.Errorf("config: --%s %q must be absolute", name, v)
		}
		*dst(c) = p
		return nil
	}
}

// pathList reads a repeatable, ','-separated list of absolute paths (flag values, else env).
func pathList(name string, flags []string, env string, getenv func(string) string) ([]string, error) {
	if len(flags) == 0 && env != "" {
		flags = []string{env}
	}
	var out []string
	for _, v := range flags {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			p = filepath.Clean(expand(p, getenv))
			if !filepath.IsAbs(p) {
				return nil, fmt.Errorf("config: --%s %q must be absolute", name, p)
			}
			out = append(out, p)
		}
	}
	return out, nil
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
		raw = []string{optionDefault("sessions-dir")}
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
				continue // docs/protocol.md §7.1: entries without '=' are ignored
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

// optionDefault is the table's default of one flag.
func optionDefault(name string) string {
	for _, o := range options {
		if o.name == name {
			return o.def
		}
	}
	return ""
}

// checkLeaf applies the startup rules of leaf mode (docs/protocol.md §7.5, §10.1): a leaf needs
// its principal, and may have no federation listener (nobody connects to a leaf) and no
// attested services (it admits one service on uid alone). Its HTTP API is on its http.sock;
// --listen adds a TCP listener for a bot that cannot use a Unix socket.
func (c *Config) checkLeaf() error {
	if !c.Leaf {
		if c.LeafPrincipal != "" || c.LeafRegisterSock != "" || c.LeafListenNonLoopback {
			return errors.New("config: --leaf-principal, --leaf-register-sock and --leaf-listen-non-loopback need --leaf")
		}
		return nil
	}
	switch {
	case c.LeafPrincipal == "":
		return errors.New("config: --leaf needs --leaf-principal")
	case c.FedListen != "":
		return errors.New("config: --leaf forbids --fed-listen (a leaf accepts no federation connection)")
	case len(c.SvcExe) > 0:
		return errors.New("config: --leaf forbids --svc-exe (a leaf admits only its principal's service, on uid alone)")
	}
	if c.LeafRegisterSock == "" {
		c.LeafRegisterSock = c.RegisterSock
	}
	return c.checkLeafListen()
}

// checkLeafListen: a leaf's --listen has no peer check and speaks as the leaf's principal
// to its hubs, so it is the pod's (loopback) only, unless the operator says otherwise by
// name. Only an IP literal counts: a host name could resolve anywhere.
func (c *Config) checkLeafListen() error {
	if c.Listen == "" || c.LeafListenNonLoopback {
		return nil
	}
	host, _, _ := net.SplitHostPort(c.Listen)
	if ip, err := netip.ParseAddr(host); err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("config: --leaf --listen %q: not a loopback IP address; whoever reaches this listener sends as the leaf's principal (--leaf-listen-non-loopback allows it)", c.Listen)
	}
	return nil
}
