//go:build linux

package httpapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestHealthzWithoutSessionDirs: a bus that serves no session directory (a leaf's: its
// scanner has none) answers /healthz without a sessions_dir field, and 100 probes open
// nothing (no inotify instance for directories it does not have). A daemon with a session
// directory still reports it, as a control.
func TestHealthzWithoutSessionDirs(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(filepath.Join(dir, "x.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	probe := func(b *bus.Bus) map[string]any {
		rec := httptest.NewRecorder()
		Handler(Config{Bus: b, MaxBody: 65536, Log: log, Socket: "http"}).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		var v map[string]any
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &v) != nil {
			t.Fatalf("healthz: %d %s", rec.Code, rec.Body)
		}
		return v
	}
	leaf := bus.New(bus.Config{Host: "leaf", MaxBody: 65536, ReplyTTL: time.Hour, IdemTTL: time.Hour, Store: st, Proc: peercred.Proc{}, Log: log,
		Claude: &claude.Scanner{Proc: peercred.Proc{}, UID: os.Geteuid(), Log: log}})
	t.Cleanup(leaf.Close)
	before := openFDs(t)
	for i := 0; i < 100; i++ {
		v := probe(leaf)
		if _, ok := v["sessions_dir"]; ok || v["status"] != "ok" {
			t.Fatalf("a bus without session dirs answered %v; want status ok and no sessions_dir", v)
		}
	}
	if after := openFDs(t); after != before {
		t.Errorf("100 probes of a bus without session dirs: %d descriptors before, %d after; want none opened", before, after)
	}

	missing := filepath.Join(dir, "sessions")
	hub := bus.New(bus.Config{Host: "hub", MaxBody: 65536, ReplyTTL: time.Hour, IdemTTL: time.Hour, Store: st, Proc: peercred.Proc{}, Log: log,
		Claude: &claude.Scanner{Dirs: []string{missing}, Proc: peercred.Proc{}, UID: os.Geteuid(), Log: log}})
	t.Cleanup(hub.Close)
	if v := probe(hub); v["sessions_dir"] != "sessions_dir_missing" {
		t.Errorf("a bus whose session dir is missing answered %v; want sessions_dir_missing", v)
	}
}
