package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	l := &Limiter{Every: 10 * time.Second, Now: func() time.Time { return now }}
	log := slog.New(Handler(slog.NewTextHandler(&buf, nil), l, "peer", "code"))
	for range 5 {
		log.Warn("leaf poll failed", "peer", "hub", "code", "peer_unreachable", "retry_in", "5s")
		log.Info("leaf poll ok", "peer", "hub")
	}
	log.Warn("leaf poll failed", "peer", "hub", "code", "hub_busy")
	log.Warn("leaf poll failed", "peer", "other", "code", "peer_unreachable")
	now = now.Add(11 * time.Second)
	log.Warn("leaf poll failed", "peer", "hub", "code", "peer_unreachable", "retry_in", "5s")
	out := buf.String()
	if got := strings.Count(out, `msg="leaf poll failed" peer=hub code=peer_unreachable`); got != 2 {
		t.Errorf("%d lines of one kind in 11 s, want 2 (one per 10 s):\n%s", got, out)
	}
	if !strings.Contains(out, "suppressed=4") {
		t.Errorf("the second line does not count the 4 suppressed:\n%s", out)
	}
	if strings.Count(out, "leaf poll ok") != 5 || !strings.Contains(out, "code=hub_busy") || !strings.Contains(out, "peer=other") {
		t.Errorf("info lines or other kinds were dropped:\n%s", out)
	}
}
