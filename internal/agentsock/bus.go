package agentsock

import (
	"context"
	"encoding/json"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/ledger"
)

// Bus is what agent.sock asks of the bus: attesting a caller by its ancestry and re-checking
// it, sends and replies as that caller, agy's credential-less start, and a Codex thread's
// queue (poll, peek, ack). *bus.Bus is one.
type Bus interface {
	// Events is the stream each answered request is announced on (ledger.Stream.Request).
	Events() *ledger.Stream
	Host() string
	Harnesses() *harness.Registry
	Attest(pid int, meta json.RawMessage) (bus.Attested, error)
	Agy() bus.Agy
	Ancestry(pid int) string
	Send(ctx context.Context, s bus.Send) (bus.Delivery, error)
	Reply(ctx context.Context, caller bus.Caller, messageID, text string) (bus.ReplyResult, error)
	Poll(ctx context.Context, r *bus.Registration, wait time.Duration) (*bus.Queued, error)
	Peek(r *bus.Registration, limit, maxBytes int) ([]bus.Queued, int, error)
	Ack(ctx context.Context, r *bus.Registration, messageID string) error
}

var _ Bus = (*bus.Bus)(nil)
