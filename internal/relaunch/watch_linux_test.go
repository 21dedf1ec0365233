//go:build linux

package relaunch

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fired reports whether w fires within wait.
func fired(w *Watch, wait time.Duration) (string, bool) {
	select {
	case dir := <-w.C():
		return dir, true
	case <-time.After(wait):
		return "", false
	}
}

// TestWatch: a missing session dir fires when a component of its path appears at its nearest
// existing ancestor; an existing one fires when it is removed or replaced; other entries
// appearing beside them do not fire; it fires once.
func TestWatch(t *testing.T) {
	Settle = 10 * time.Millisecond
	base := t.TempDir()
	missing := filepath.Join(base, "home", ".claude", "sessions")
	os.Mkdir(filepath.Join(base, "home"), 0o700)
	existing := filepath.Join(base, "sessions")
	os.Mkdir(existing, 0o700)

	cases := []struct {
		name   string
		change func()
		want   string
	}{
		{"unrelated entries", func() {
			os.Mkdir(filepath.Join(base, "home", ".config"), 0o700)
			os.WriteFile(filepath.Join(base, "other"), nil, 0o600)
			os.WriteFile(filepath.Join(existing, "123.json"), nil, 0o600)
		}, ""},
		{"missing dir's ancestor appears", func() { os.MkdirAll(missing, 0o700) }, missing},
		{"existing dir replaced", func() {
			os.Mkdir(filepath.Join(base, "new"), 0o700)
			os.RemoveAll(existing)
			os.Rename(filepath.Join(base, "new"), existing)
		}, existing},
		{"existing dir removed", func() { os.RemoveAll(existing) }, existing},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			os.RemoveAll(filepath.Join(base, "home", ".claude"))
			os.MkdirAll(existing, 0o700)
			w, skipped, err := NewWatch([]string{missing, existing})
			if err != nil || len(skipped) != 0 {
				t.Fatalf("NewWatch: %v %v", err, skipped)
			}
			defer w.Close()
			c.change()
			// A change fires after Settle: a generous wait for one, a short one for none.
			wait := 10 * time.Second
			if c.want == "" {
				wait = Settle + 300*time.Millisecond
			}
			dir, ok := fired(w, wait)
			switch {
			case c.want == "" && ok:
				t.Fatalf("fired for %s; want nothing", dir)
			case c.want != "" && (!ok || dir != c.want):
				t.Fatalf("fired %v %q; want %q", ok, dir, c.want)
			}
			if c.want != "" {
				os.MkdirAll(filepath.Join(base, "home", ".claude", "x"), 0o700)
				if dir, ok := fired(w, Settle+300*time.Millisecond); ok {
					t.Fatalf("fired twice (%s)", dir)
				}
			}
		})
	}
}
