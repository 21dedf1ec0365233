package bus

import (
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/records"
	"github.com/xmsg/xmsg/internal/store"
)

// reportOutcomes are the outcomes a Claude Code session's peer status report makes of a
// message it was delivered to (every outcome word a report can set is here): held for the
// person's decision, then delivered to the model, or denied (by the person, or refused by
// the session's policy), expired (no decision in time), dropped (the session's ingress
// guard discarded it). The exact status is kept beside it (Message.Report).
var reportOutcomes = map[string]ledger.Outcome{
	claude.ReportHeld:      ledger.Held,
	claude.ReportDelivered: ledger.Delivered,
	claude.ReportDenied:    ledger.Denied,
	claude.ReportRefused:   ledger.Denied,
	claude.ReportExpired:   ledger.Expired,
	claude.ReportDropped:   ledger.Dropped,
}

// Claude is the bus's Claude Code side: what only Claude sessions ask of it or tell it (the
// peer status reports of its inbox lines, the sessions that hold mail for their user).
type Claude struct{ b *Bus }

// Claude is the bus's Claude Code side.
func (b *Bus) Claude() Claude { return Claude{b} }

// Report records a session's report on a message: only the recipient session's own
// process (the pid its live session file names, with that file's start time) may report on
// it; anything else is ignored, as is a report on a message this daemon did not deliver to
// a Claude session, and any report after the one that settled it.
func (c Claude) Report(cred peercred.Cred, r claude.Report) {
	b := c.b
	outcome, ok := reportOutcomes[r.Status]
	if !ok {
		return
	}
	var m store.Message
	var found bool
	if err := b.cfg.Store.View(func(tx *store.Tx) (err error) {
		m, found, err = tx.Message(r.MessageID)
		return err
	}); err != nil || !found || m.RecipientHarness != claude.Name || m.Report == "" {
		b.cfg.Log.Debug("claude report for no message of ours", "peer_pid", cred.PID, "message_id", r.MessageID)
		return
	}
	if !b.reportsFor(cred, m.SessionID) {
		b.cfg.Log.Warn("claude report refused: not from the recipient session", "peer_pid", cred.PID, "message_id", r.MessageID)
		return
	}
	if _, err := records.Reported(b.cfg.Store, r.MessageID, func(m *store.Message) bool {
		// A settled message stays settled: a session reports held, then one final status.
		if claude.Final(m.Report) {
			return false
		}
		m.Report, m.Outcome = r.Status, outcome
		return true
	}); err != nil {
		b.cfg.Log.Error("recording claude report", "message_id", r.MessageID, "err", err)
		return
	}
	b.cfg.Log.Info("claude report", "message_id", r.MessageID, "session_id", m.SessionID, "status", r.Status)
	b.cfg.Events.Emit(ledger.Event{Kind: ledger.Reported, Transport: ledger.Daemon, MessageID: r.MessageID, From: m.FromName,
		To: m.SessionID, Harness: claude.Name, Outcome: outcome, Detail: r.Status})
}

// reportsFor reports whether cred is the process of the live Claude session id: its
// session file names cred's pid, and that pid still runs with the file's start time.
func (b *Bus) reportsFor(cred peercred.Cred, id string) bool {
	sessions, err := b.cfg.Claude.Lookup(id, 0)
	if err != nil {
		return false
	}
	for _, s := range sessions {
		if s.ID == id && s.Live && s.PID == cred.PID && b.cfg.Proc.Alive(s.PID, s.Start()) {
			return true
		}
	}
	return false
}

// Waiting lists the live Claude sessions whose session file says they wait for their user
// (status "waiting"), as "<id> (<what>)": such a session holds peer messages until the
// person decides (xmsg doctor notes them).
func (c Claude) Waiting() []string {
	b := c.b
	var out []string
	for _, s := range b.cfg.Claude.Scan() {
		if s.Live && s.Status == "waiting" {
			what := s.WaitingFor
			if what == "" {
				what = "its user"
			}
			out = append(out, s.ID+" ("+what+")")
		}
	}
	return out
}
