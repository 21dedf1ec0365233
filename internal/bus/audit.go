package bus

import (
	"context"
	"log/slog"
	"time"

	"github.com/xmsg/xmsg/internal/ratelog"
)

// Audit writes the audit line of one state-changing request: actor, socket, kind, target,
// outcome; never a body. Each transport holds one and writes the lines of the bus calls it
// makes (Send, Reply, Accept) once its answer is out: http.sock, agent.sock and register.sock,
// the federation listener, a leaf's pull loop. The bus writes none. Safe for concurrent use.
type Audit struct {
	log *slog.Logger
	lim ratelog.Limiter
}

// NewAudit returns an Audit writing to log.
func NewAudit(log *slog.Logger) *Audit { return &Audit{log: log} }

// Record writes one line.
// Refusals are rate-limited per (socket, request, code): one line a second, carrying the
// count of those suppressed, so a client looping on a full queue cannot flood the journal.
// Accepted requests are each logged: they are the bus's work, paid for by a commit each.
func (a *Audit) Record(socket, actor, kind, target, messageID string, err error) {
	if err != nil {
		e := AsError(err)
		lvl := slog.LevelWarn
		key := socket + " " + kind + " " + e.Code
		if e.Code == "internal" || e.Code == "insufficient_storage" || (e.Code == "service_unavailable" && OutOfResources(err)) {
			lvl = slog.LevelError
			a.lim.Log(a.log, lvl, key+" err", "request failed", "socket", socket, "actor", actor, "request", kind, "err", err)
		}
		a.lim.Log(a.log, lvl, key, "refused", "socket", socket, "actor", actor, "request", kind, "target", target, "code", e.Code, "reason", e.Detail)
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
	r := slog.NewRecord(time.Now(), slog.LevelInfo, "accepted", 0)
	r.AddAttrs(slog.String("socket", socket), slog.String("actor", actor),
		slog.String("request", kind), slog.String("target", target), slog.String("message_id", messageID))
	h.Handle(ctx, r)
}
