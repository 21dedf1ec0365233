package daemon

import (
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/config"
)

// busBounds are the shares of --queue-max-per-origin, --leaf-mailbox-max and
// --leaf-mailbox-max-bytes. A flag's 0 is "no bound", which the bus spells < 0 (its 0 is
// the default, so that a Config without Bounds is bounded).
func busBounds(cfg *config.Config) bus.Bounds {
	off := func(n int) int {
		if n == 0 {
			return -1
		}
		return n
	}
	return bus.Bounds{QueueShare: off(cfg.QueueMaxPerOrigin), MailboxMax: off(cfg.LeafMailboxMax), MailboxMaxBytes: off(cfg.LeafMailboxMaxBytes)}
}
