// Package limits holds the default bounds of the daemon's sockets: the one place that the
// servers (for a zero Config field), the flags (their defaults and --help) and the docs take
// them from. Each bound exists so that no single client can take more than its share of a
// socket's slots, memory or time; see docs/design.md §3.
package limits

import "time"

// Message sizes (docs/protocol.md §5.6).
const (
	// MaxBody is the largest message body in bytes (--max-body).
	MaxBody = 65536
)

// agent.sock (docs/protocol.md §2.4).
const (
	AgentMaxLine      = 1 << 20          // bytes per request line (--agent-max-line)
	AgentMaxConns     = 32               // attested connections at once; the next attestation is refused (--agent-max-conns)
	AgentIdleTimeout  = 60 * time.Second // no complete line for this long: closed (--agent-idle-timeout)
	AgentWriteTimeout = 10 * time.Second // an answer the client does not read: abandoned (--agent-write-timeout)
	// AgentMaxPending and AgentPendingTimeout bound connections not yet attested to a session
	// (--agent-max-pending, --agent-pending-timeout): an MCP bridge attests with its first
	// tool call, so 10 s is plenty; a process that is no session may ask (and be refused)
	// for that long, then reconnect. AgentMaxConns counts attested connections only.
	AgentMaxPending     = 32
	AgentPendingTimeout = 10 * time.Second
	// AgentMaxPerPID is how many attested connections one process may hold
	// (--agent-max-per-pid): an MCP bridge needs one or two. Unattested ones need no such
	// bound: a full pending pool evicts the heaviest holder's oldest idle one.
	AgentMaxPerPID = 8
)

// register.sock (docs/protocol.md §2.5).
const (
	RegisterFirstFrameTimeout = 30 * time.Second
	RegisterMaxFirstFrame     = 65536
	RegisterMaxFrame          = 65536*6 + 4096
	// RegisterMaxBatch is the most messages one poll hands out, and acks one poll carries,
	// when the client asks for a batch (docs/protocol.md §4.2).
	RegisterMaxBatch = 64
	// RegisterMaxBatchBytes bounds a batch's texts and envelopes together; its first message
	// is handed out whatever its size, so a large one cannot stop the queue.
	RegisterMaxBatchBytes = 256 << 10
	// RegisterMaxConns caps connections served at once. Each costs goroutines (a registered
	// one also a long-poll waiter), so without a cap one client could exhaust the daemon.
	RegisterMaxConns = 64
	// RegisterMaxPending caps connections before their first frame (--register-max-pending);
	// RegisterMaxConns counts registrations only.
	RegisterMaxPending = 32
	// RegisterMaxPerPID is how many registrations one process may hold (--register-max-per-pid).
	RegisterMaxPerPID = 8
	// RegisterMaxUIDOnly caps uid-only registrations (pi, opencode, hermes, cli), which any process
	// of the uid can make, leaving the rest of RegisterMaxConns to exe-attested services
	// (--register-max-uid-only).
	RegisterMaxUIDOnly = 16
	// RegisterIdleTimeout is how long a registration may send no frame beyond a poll's wait
	// (--register-idle-timeout): a client polls in a loop, so two quiet minutes mean it is gone
	// or holding a slot.
	RegisterIdleTimeout = 2 * time.Minute
)

// http.sock. 256 connections need about 256 descriptors and at most 256 × (64 KiB of headers
// + one body) of memory. A full pool closes its oldest idle keep-alive (of the process holding
// the most) for a new connection; only connections in a request cannot be evicted, and one
// process may have a quarter of the pool in requests at once (a client with a pool of 64).
const (
	HTTPMaxConns         = 256              // connections at once; the next evicts the oldest idle one (--http-max-conns)
	HTTPMaxPerPID        = 64               // requests in progress of one process; the next gets 503 (--http-max-per-pid)
	HTTPMaxWaiters       = 128              // reply long-polls waiting at once; the next gets 503 (--http-max-waiters)
	HTTPMaxWaitersPerPID = 32               // of them, one process's (--http-max-waiters-per-pid)
	HTTPHeaderTimeout    = 5 * time.Second  // request headers, from the request's first byte (--http-header-timeout)
	HTTPBodyTimeout      = 10 * time.Second // request body, from the end of the headers (--http-body-timeout)
	HTTPIdleTimeout      = 60 * time.Second // keep-alive connection between requests (--http-idle-timeout)
)

// Retention (docs/protocol.md §5.6).
const (
	ReplyTTL       = 7 * 24 * time.Hour // messages, replies, queues (--reply-ttl)
	IdempotencyTTL = 24 * time.Hour     // idempotency keys (--idempotency-ttl)
)
