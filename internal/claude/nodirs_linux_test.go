//go:build linux

package claude

import (
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/xmsg/xmsg/internal/peercred"
)

// TestNoDirsOpensNothing: a scanner without directories (a leaf's) opens no descriptor, not
// even an inotify instance, however often it is asked.
func TestNoDirsOpensNothing(t *testing.T) {
	s := &Scanner{Proc: peercred.Proc{}, UID: os.Geteuid(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	count := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := count()
	for i := 0; i < 100; i++ {
		if p := s.Problems(); len(p) != 0 {
			t.Fatalf("problems without directories: %v", p)
		}
		s.WatchReport()
	}
	if after := count(); after != before {
		t.Errorf("100 looks without directories: %d descriptors before, %d after; want none opened", before, after)
	}
}
