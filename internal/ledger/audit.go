package ledger

import (
	"context"
	"log/slog"
	"time"

	"github.com/xmsg/xmsg/internal/ratelog"
)

// Audit is the sink that writes the audit log (docs/security.md §6): one line per accepted
// request (socket, actor, request, target, message id; never a body) and one per refusal.
// Built once, in internal/daemon. Safe for concurrent use.
type Audit struct {
	log *slog.Logger
	lim ratelog.Limiter
}

// AuditLog returns the audit sink writing to log.
func AuditLog(log *slog.Logger) *Audit { return &Audit{log: log} }

// Event writes e's line. Only requests are audited (an event with a Request word): what the
// daemon does on its own (a harness's report, retention) is counted and watched, not logged.
// Refusals are rate-limited per (socket, request, code): one line a second, carrying the
// count of those suppressed, so a client looping on a full queue cannot flood the journal.
// Accepted requests are each logged: they are the bus's work, paid for by a commit each.
func (a *Audit) Event(e *Event) {
	if e.Request == "" {
		return
	}
	socket := e.Transport.String()
	if e.Kind == Refused {
		code := e.CodeWord()
		lvl := slog.LevelWarn
		key := socket + " " + e.Request + " " + code
		if c := *e.Code; c == Internal || c == InsufficientStorage || (c == ServiceUnavailable && OutOfResources(e.Err)) {
			lvl = slog.LevelError
			a.lim.Log(a.log, lvl, key+" err", "request failed", "socket", socket, "actor", e.From, "request", e.Request, "err", e.Err)
		}
		a.lim.Log(a.log, lvl, key, "refused", "socket", socket, "actor", e.From, "request", e.Request, "target", e.To, "code", code, "reason", e.Detail)
		return
	}
	// The record goes to the handler directly: the same line as Info with these pairs, without
	// boxing each value, and without the caller's program counter that Logger looks up for
	// every record (runtime.Callers, about 1% of a send) though xmsg's handler never prints it.
	ctx := context.Background()
	h := a.log.Handler()
	if !h.Enabled(ctx, slog.LevelInfo) {
		return
	}
	msg := "accepted"
	if e.Kind == Watched {
		msg = "watching"
	}
	r := slog.NewRecord(time.Now(), slog.LevelInfo, msg, 0)
	r.AddAttrs(slog.String("socket", socket), slog.String("actor", e.From), slog.String("request", e.Request))
	if e.To != "" || e.Kind == Sent {
		r.AddAttrs(slog.String("target", e.To))
	}
	r.AddAttrs(slog.String("message_id", e.MessageID))
	if e.Detail != "" {
		r.AddAttrs(slog.String("detail", e.Detail))
	}
	h.Handle(ctx, r)
}
