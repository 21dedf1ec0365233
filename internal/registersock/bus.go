package registersock

import (
	"context"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
)

// Bus is what register.sock asks of the bus: registrations of sessions, services and agy
// conversations (and their liveness), a registration's queue, replies, and agy's credential
// check and flush. *bus.Bus is one.
type Bus interface {
	// Events is the stream each answered request is announced on (ledger.Stream.Request).
	Events() *ledger.Stream
	Harnesses() *harness.Registry
	RegisterSession(kind, name, cwd string, cred peercred.Cred, connectStart string) (*bus.Registration, error)
	RegisterService(name, cwd string, cred peercred.Cred, connectStart string) (*bus.Registration, error)
	Agy() bus.Agy
	Unregister(r *bus.Registration)
	Alive(r *bus.Registration) bool
	Poll(ctx context.Context, r *bus.Registration, wait time.Duration) (*bus.Queued, error)
	// Peek is a batch poll's messages (Poll found the first).
	Peek(r *bus.Registration, limit, maxBytes int) (msgs []bus.Queued, more int, err error)
	Ack(ctx context.Context, r *bus.Registration, messageID string) error
	Reply(ctx context.Context, caller bus.Caller, messageID, text string) (bus.ReplyResult, error)
}

var _ Bus = (*bus.Bus)(nil)
