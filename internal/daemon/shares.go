package daemon

import (
	"log/slog"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/store"
)

// busBounds are the shares of --queue-max-per-origin. A flag's 0 is "no bound", which the bus
// (and the hub) spell < 0 (their 0 is the default, so that a Config without bounds is
// bounded).
func busBounds(cfg *config.Config) bus.Bounds {
	return bus.Bounds{QueueShare: off(cfg.QueueMaxPerOrigin)}
}

// mailboxes are a hub's leaf mailboxes, bounded by --leaf-mailbox-max and
// --leaf-mailbox-max-bytes.
func mailboxes(cfg *config.Config, st *store.Store, log *slog.Logger) *hub.Mailboxes {
	return hub.New(st, log, off(cfg.LeafMailboxMax), off(cfg.LeafMailboxMaxBytes))
}

func off(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
