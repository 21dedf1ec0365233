package bus

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"syscall"

	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/principal"
	"github.com/xmsg/xmsg/internal/store"
)

// Send is one message to deliver. The servers fill it from attested facts only: FromName,
// Principal and Caller come from the socket and the kernel, never from request fields. Where
// the request came from (its audit line) and when the work that can wait runs are the
// transport's decoration (Audit, WithAfter), not the message's.
type Send struct {
	To          envelope.Ref
	Text        string
	Bytes       int     // the protocol's `bytes` (docs/protocol.md §3.4): as the transport counts them
	FromName    string  // sender badge
	Principal   string  // idempotency scope
	Caller      *Caller // attested sender; nil for anonymous HTTP (then no return address)
	PushReplies bool
	Key         string // idempotency key, optional
	From        string // anonymous sender's sanitized name: its federation principal
	// FedPrincipal, when set, is the federation principal of a remote send instead of one
	// derived from Caller or From: a leaf attributes every send to its configured principal.
	FedPrincipal *principal.Principal
}

type afterKey struct{}

// WithAfter decorates ctx for the bus: work that can wait until the transport's answer is out
// (closing a Claude inbox's connection, its line already written) is handed to after, which
// the transport runs once the answer is written, off the sender's wait. Without it the work
// is done before the call returns. The effects are the same either way.
func WithAfter(ctx context.Context, after func(work func())) context.Context {
	return context.WithValue(ctx, afterKey{}, after)
}

// later hands work to ctx's WithAfter, or does it now.
func later(ctx context.Context, work func()) {
	if after, ok := ctx.Value(afterKey{}).(func(func())); ok && after != nil {
		after(work)
		return
	}
	work()
}

// Delivery is what an accepted send did (docs/protocol.md §3.5).
type Delivery struct {
	SessionID string
	FromName  string
	Bytes     int
	MessageID string
	Outcome   ledger.Outcome
	// Harness is the recipient's harness, and Peer the configured peer a remote send went to,
	// for the send's event; no answer carries them.
	Harness string
	Peer    string
}

// Result is what the send's event says of it, and its text for a monitor that asked for it.
func (d Delivery) Result(text string) ledger.Result {
	return ledger.Result{MessageID: d.MessageID, Harness: d.Harness, Peer: d.Peer, Outcome: d.Outcome, Bytes: d.Bytes, Text: text}
}

// keyLocks serializes sends that share an idempotency key, so two concurrent retries cannot
// both miss the record and deliver twice.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	n int
}

func (k *keyLocks) lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{}
		k.m[key] = l
	}
	l.n++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.n--; l.n == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// Send delivers a message and records it. It returns only after the record is committed
// and fsynced; a refused send changes nothing.
func (b *Bus) Send(ctx context.Context, s Send) (d Delivery, err error) {
	if s.Text == "" {
		return d, badRequest("text must not be empty")
	}
	if len(s.Text) > b.cfg.MaxBody {
		return d, errorf(ledger.BodyTooLarge, "text %d exceeds limit %d", len(s.Text), b.cfg.MaxBody)
	}
	if s.Key != "" {
		if err := envelope.ValidIdempotencyKey(s.Key); err != nil {
			return d, badRequest("invalid idempotency key: %v", err)
		}
		defer b.keys.lock(s.Principal + "\x00" + s.Key)()
		rec, found, err := b.idem(s.Principal, s.Key)
		if err != nil {
			return d, err
		}
		if found {
			if rec.Body != s.Text {
				return d, errorf(ledger.Conflict, "idempotency key reused with a different body")
			}
			return Delivery{SessionID: rec.SessionID, FromName: rec.FromName, Bytes: rec.Bytes, MessageID: rec.MessageID, Outcome: rec.Outcome}, nil
		}
	}
	if s.To.Remote() && s.To.Host() != b.cfg.Host {
		return b.sendRemote(ctx, s, s.To.Target(), s.To.Host())
	}
	t, err := b.Resolve(s.To.Target())
	if err != nil {
		return d, err
	}
	a := arrival{fromName: s.FromName, text: s.Text, bytes: s.Bytes, ret: s.Caller, push: s.PushReplies,
		origin: func() json.RawMessage {
			if s.Caller == nil {
				return fmtOrigin("anonymous", nil)
			}
			return fmtOrigin("local", s.Caller)
		}}
	if s.Key != "" {
		a.idem = &store.Idem{Principal: s.Principal, Key: s.Key, Body: s.Text}
	}
	return b.deliver(ctx, t, a)
}

func (b *Bus) idem(principal, key string) (store.Idem, bool, error) {
	var rec store.Idem
	var found bool
	err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		rec, found, err = tx.Idem(principal, key)
		return err
	})
	// Records older than the TTL are ignored even before the purge removes them.
	if found && rec.CreatedAt < b.nowUnix()-int64(b.cfg.IdemTTL.Seconds()) {
		found = false
	}
	return rec, found, err
}

// errOwnSocket: the inbox path is one of the daemon's own sockets.
var errOwnSocket = errors.New("bus: messaging socket is one of the daemon's own sockets")

// deliverClaude writes line to a Claude inbox, refusing the daemon's own sockets: a session
// file may name any path, and a delivery the daemon accepts from itself would be reported
// delivered although no session received it.
func (b *Bus) deliverClaude(path string, line []byte) error {
	in := b.dialClaude(path)
	defer in.Close()
	return in.Write(line)
}

// dialClaude starts a delivery to a Claude inbox (claude.Dial), refusing the daemon's own
// sockets as deliverClaude does.
func (b *Bus) dialClaude(path string) *claude.Inbox {
	if b.ownSocket(path) {
		return claude.Failed(errOwnSocket)
	}
	return claude.Dial(path, b.cfg.InboxTimeout)
}

// ownSocket compares the file path names (after symlinks) with the daemon's sockets by
// device and inode, so another name for the same socket is caught too.
func (b *Bus) ownSocket(path string) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	// The sockets' identities are kept once found, so that a delivery stats one path, not
	// every socket too: each is the socket the daemon listens on for its whole life, and
	// still that socket (so still refused under another name) if its path is later removed
	// or replaced. One not found yet is looked for again at the next delivery.
	b.ownMu.Lock()
	defer b.ownMu.Unlock()
	if b.ownFiles == nil {
		b.ownFiles = make([]os.FileInfo, len(b.cfg.OwnSockets))
	}
	for i, own := range b.cfg.OwnSockets {
		if b.ownFiles[i] == nil {
			if ofi, err := os.Stat(own); err == nil {
				b.ownFiles[i] = ofi
			}
		}
		if b.ownFiles[i] != nil && os.SameFile(fi, b.ownFiles[i]) {
			return true
		}
	}
	return false
}

func inboxError(err error) *Error {
	if errors.Is(err, errOwnSocket) {
		return errorf(ledger.InboxUnavailable, "session inbox unavailable: its messaging socket is the bus itself")
	}
	if ledger.OutOfResources(err) {
		// The delivery could not even be attempted; nothing is wrong with the session.
		return errorf(ledger.ServiceUnavailable, "out of file descriptors or memory; delivery not attempted, retry later")
	}
	if errors.Is(err, claude.ErrInboxTimeout) {
		return errorf(ledger.InboxTimeout, "session inbox did not accept the message within the timeout")
	}
	return errorf(ledger.InboxUnavailable, "session inbox unavailable: %s", errText(err))
}

// errText names the failing syscall condition without echoing paths of other users.
func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return "connection failed"
}
