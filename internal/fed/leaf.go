package fed

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
)

// The leaf's side of docs/protocol.md §7.5: Inbox and AckInbox are the client of the hub's
// GET /fed/v2/inbox and POST /fed/v2/inbox/{id}/ack (server.go), and Hubs names the peers a
// leaf pulls from.

// InboxAckTimeout is the budget of one inbox ack (§5.6).
const InboxAckTimeout = 10 * time.Second

// Hubs returns the peers a leaf pulls from: every peer that is not itself a leaf.
func (n *Node) Hubs() []string {
	var out []string
	for _, p := range n.st.Load().peers.All() {
		if !p.Leaf {
			out = append(out, p.Name)
		}
	}
	return out
}

// Inbox long-polls peer's GET /fed/v2/inbox (budget wait + 5 s); nil means nothing came.
func (n *Node) Inbox(ctx context.Context, peer string, wait time.Duration) (*bus.InboxRow, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+CallTimeout)
	defer cancel()
	var row *bus.InboxRow
	q := url.Values{"wait": {strconv.Itoa(int(wait / time.Second))}}
	if err := n.call(ctx, peer, http.MethodGet, "/fed/v2/inbox?"+q.Encode(), nil, &row, ""); err != nil {
		return nil, err
	}
	return row, nil
}

// AckInbox acknowledges row id of our mailbox on peer (budget 10 s). A 404 comes back as
// the peer's error: the row is gone, which is what the ack wanted.
func (n *Node) AckInbox(ctx context.Context, peer, id string) error {
	ctx, cancel := context.WithTimeout(ctx, InboxAckTimeout)
	defer cancel()
	return n.call(ctx, peer, http.MethodPost, "/fed/v2/inbox/"+url.PathEscape(id)+"/ack", struct{}{}, nil, id)
}

// NamedHubs returns the hubs whose address names a host instead of an IP: reaching them needs
// DNS, which a sandboxed daemon cannot do (no UDP, TCP connects only to peer ports).
func (n *Node) NamedHubs() []string {
	var out []string
	for _, p := range n.st.Load().peers.All() {
		if host, _, err := net.SplitHostPort(p.Address); !p.Leaf && (err != nil || net.ParseIP(host) == nil) {
			out = append(out, p.Name)
		}
	}
	return out
}
