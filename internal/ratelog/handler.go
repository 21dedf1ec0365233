package ratelog

import (
	"context"
	"log/slog"
)

// Handler wraps h so that warnings and errors pass at most once per interval per kind,
// where the kind is the message and the values of the attributes named by keys (a leaf's
// "leaf poll failed" per peer and code): a loop that retries every few seconds for hours
// writes one line per interval, each with "suppressed", the count dropped since the previous
// one. Records below Warn pass untouched. Attributes given to WithAttrs are not part of the
// kind.
func Handler(h slog.Handler, l *Limiter, keys ...string) slog.Handler {
	return &handler{h: h, l: l, keys: keys}
}

type handler struct {
	h    slog.Handler
	l    *Limiter
	keys []string
}

func (r *handler) Enabled(ctx context.Context, level slog.Level) bool { return r.h.Enabled(ctx, level) }

func (r *handler) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level < slog.LevelWarn {
		return r.h.Handle(ctx, rec)
	}
	kind := rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		for _, k := range r.keys {
			if a.Key == k {
				kind += "\x00" + k + "=" + a.Value.String()
			}
		}
		return true
	})
	ok, suppressed := r.l.Allow(kind)
	if !ok {
		return nil
	}
	rec = rec.Clone()
	rec.AddAttrs(slog.Int("suppressed", suppressed))
	return r.h.Handle(ctx, rec)
}

func (r *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &handler{h: r.h.WithAttrs(attrs), l: r.l, keys: r.keys}
}

func (r *handler) WithGroup(name string) slog.Handler {
	return &handler{h: r.h.WithGroup(name), l: r.l, keys: r.keys}
}
