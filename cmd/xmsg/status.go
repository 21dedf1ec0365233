package main

import (
	"flag"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/xmsg/xmsg/internal/ledger"
)

// statusMessage is GET /v1/messages/{id}'s answer, as far as `xmsg status` shows it.
type statusMessage struct {
	ID               string        `json:"id"`
	CreatedAt        int64         `json:"createdAt"`
	SessionID        string        `json:"sessionId"`
	FromName         string        `json:"fromName"`
	Bytes            int           `json:"bytes"`
	Outcome          string        `json:"outcome"`
	RecipientHarness string        `json:"recipientHarness"`
	Replies          []statusReply `json:"replies"`
}

type statusReply struct {
	Seq              uint64  `json:"seq"`
	CreatedAt        int64   `json:"createdAt"`
	ReplierSessionID string  `json:"replierSessionId"`
	PushOutcome      *string `json:"pushOutcome"`
}

// terminal reports whether nothing more is to come for m: a reply arrived, or its outcome
// ends its life (denied, expired, delivery_failed).
func (m *statusMessage) terminal() bool {
	switch o, _ := ledger.ParseOutcome(m.Outcome); o {
	case ledger.Denied, ledger.Expired, ledger.Dropped, ledger.Undelivered,
		ledger.NoRecipient, ledger.AmbiguousRecipient, ledger.RecipientGone, ledger.NotTaken:
		return true
	}
	return len(m.Replies) > 0
}

// statusFlags is `xmsg status ID`: it shows one message's life from the store: sent (when, by whom, to whom), its
// outcome as now recorded, and each reply. With --wait S it follows the message (outcome
// changes, replies) until a terminal state, or exits 1 after S seconds.
func statusFlags(fs *flag.FlagSet, st stdio) func([]string) error {
	sock, asJSON := clientFlags(fs)
	tcpURL := tcpURLFlag(fs, "")
	wait := fs.Int("wait", 0, "follow the message up to this many seconds, until it is replied to, denied, expired or failed")
	return func(pos []string) error {
		stdout := st.out
		if len(pos) != 1 || *wait < 0 {
			return usageError{"usage: xmsg status MESSAGE_ID [--wait S] [--json]"}
		}
		c, err := runningClient(*tcpURL, *sock)
		if err != nil {
			return err
		}
		path := "/v1/messages/" + url.PathEscape(pos[0])
		var m statusMessage
		if err := c.do("GET", path, nil, &m); err != nil {
			return err
		}
		if !*asJSON {
			fmt.Fprintf(stdout, "message %s\n", printable(m.ID))
			fmt.Fprintf(stdout, "  %-20s sent     from %s to %s (%s), %d bytes\n", stamp(m.CreatedAt), printable(m.FromName), printable(m.SessionID), printable(m.RecipientHarness), m.Bytes)
			fmt.Fprintf(stdout, "  %-20s %-8s (as recorded now)\n", "", printable(m.Outcome))
			printReplies(stdout, m.Replies)
		}
		deadline := time.Now().Add(time.Duration(*wait) * time.Second)
		c.http.Timeout = 30 * time.Second
		for *wait > 0 && !m.terminal() {
			left := time.Until(deadline)
			if left <= 0 {
				if *asJSON {
					printJSON(stdout, m)
				}
				return exitError{exitFailure, fmt.Errorf("status: still %s after %ds", m.Outcome, *wait)}
			}
			// A reply wakes the long-poll at once; an outcome change is seen within a poll
			// (5 s at most).
			var replies []statusReply
			// At least a second: a wait rounded down to 0 near the deadline would poll in a loop.
			q := fmt.Sprintf("%s/replies?after=0&wait=%d", path, max(1, int(min(left, 5*time.Second).Seconds()+0.5)))
			if err := c.do("GET", q, nil, &replies); err != nil {
				return err
			}
			var next statusMessage
			if err := c.do("GET", path, nil, &next); err != nil {
				return err
			}
			if !*asJSON {
				if next.Outcome != m.Outcome {
					fmt.Fprintf(stdout, "  %-20s %-8s (was %s)\n", time.Now().UTC().Format(time.RFC3339), printable(next.Outcome), printable(m.Outcome))
				}
				if len(next.Replies) > len(m.Replies) {
					printReplies(stdout, next.Replies[len(m.Replies):])
				}
			}
			m = next
		}
		if *asJSON {
			return printJSON(stdout, m)
		}
		return nil
	}
}

func printReplies(w io.Writer, rs []statusReply) {
	for _, r := range rs {
		push := ""
		if r.PushOutcome != nil {
			push = ", push " + printable(*r.PushOutcome)
		}
		fmt.Fprintf(w, "  %-20s replied  #%d by %s%s\n", stamp(r.CreatedAt), r.Seq, printable(r.ReplierSessionID), push)
	}
}

func stamp(unix int64) string { return time.Unix(unix, 0).UTC().Format(time.RFC3339) }
