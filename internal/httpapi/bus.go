package httpapi

import (
	"context"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/ledger"
)

// Bus is what the HTTP API asks of the bus: sends, the session list and lookups, messages
// and their replies, a peer's sessions, and the facts /healthz reports. *bus.Bus is one.
type Bus interface {
	// Events is the stream each answered request is announced on (ledger.Stream.Request).
	Events() *ledger.Stream
	Host() string
	Send(ctx context.Context, s bus.Send) (bus.Delivery, error)
	Resolve(ref string) (bus.Target, error)
	Sessions(cwd, status string) []bus.Session
	RemoteSessions(ctx context.Context, peer string) ([]bus.RemoteSession, error)
	Message(id string) (bus.Message, error)
	Replies(ctx context.Context, id string, after uint64, wait time.Duration) ([]bus.Reply, error)
	SessionDirs() bus.SessionDirs
}

var _ Bus = (*bus.Bus)(nil)
