//go:build !linux

package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/config"
)

// TestRefusesOffLinux: without a peer gate the daemon does not start, says why in one line,
// and opens nothing (no store file appears).
func TestRefusesOffLinux(t *testing.T) {
	db := filepath.Join(t.TempDir(), "x.db")
	d := New(Config{Config: &config.Config{DBPath: db}})
	defer d.Close()
	started, err := d.Start(context.Background())
	if started || err == nil || !strings.Contains(err.Error(), "Linux only") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Start: got %v, %v; want a one-line refusal naming Linux", started, err)
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Fatalf("store file: %v, want none", err)
	}
}
