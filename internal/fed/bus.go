package fed

import (
	"context"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/store"
)

// Bus is what the federation listener asks of the bus: resolving and listing local sessions
// for a peer, the inbound half of a federated message and its replies (docs/protocol.md
// §8.3), and a hub's side of its leaves' mailboxes (§8.4). *bus.Bus is one; the listener
// needs nothing else of it.
type Bus interface {
	Resolve(ref string) (bus.Target, error)
	Sessions(cwd, status string) []bus.SessionView
	DeliverFed(ctx context.Context, m bus.FedMessage) (bus.Delivery, error)
	FedStored(id, peer string) (bus.Delivery, bool, error)
	FedRecordFailure(id, peer, ref, fromName string, bytes int, resolveErr error) error
	FedReply(ctx context.Context, r bus.FedReplyIn) (outcome, messageID string, err error)
	FedReplies(ctx context.Context, peer, id string, after uint64, wait time.Duration) ([]bus.ReplyView, error)
	LeafInbox(ctx context.Context, peer string, wait time.Duration) (*store.MailboxEntry, error)
	LeafInboxBatch(ctx context.Context, peer string, wait time.Duration, maxN, maxBytes int) ([]store.MailboxEntry, error)
	LeafAck(peer, id string) error
	LeafAckBatch(peer string, ids []string) (int, error)
}

var _ Bus = (*bus.Bus)(nil)
