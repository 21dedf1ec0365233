package fed

import (
	"context"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/ledger"
)

// Bus is what the federation listener asks of the bus: resolving and listing local sessions
// for a peer, and the inbound half of a federated message and its replies (docs/protocol.md
// §8.3). *bus.Bus is one; the listener needs nothing else of it. A hub's side of its
// leaves' mailboxes (§8.4) is internal/hub's (Node.Mailboxes).
type Bus interface {
	// Events is the stream each answered request is announced on (ledger.Stream.Request).
	Events() *ledger.Stream
	Resolve(ref string) (bus.Target, error)
	Sessions(cwd, status string) []bus.Session
	Accept(ctx context.Context, in bus.Inbound, t bus.Target, unresolved error) (bus.Delivery, error)
	AcceptReply(ctx context.Context, r bus.InboundReply) (outcome ledger.Outcome, messageID string, err error)
	PeerReplies(ctx context.Context, peer, id string, after uint64, wait time.Duration) ([]bus.Reply, error)
}

var _ Bus = (*bus.Bus)(nil)
