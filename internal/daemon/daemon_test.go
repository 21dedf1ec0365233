package daemon

import (
	"slices"
	"testing"

	"github.com/xmsg/xmsg/internal/config"
)

func names(steps []step) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.name)
	}
	return out
}

// TestSteps: the startup order of docs/design.md §2 for each kind of daemon. Leaf mode keeps
// the store and sd_notify steps and replaces or drops the others; in-process (the test
// support) the steps that change the whole process are left out.
func TestSteps(t *testing.T) {
	tests := []struct {
		name      string
		leaf      bool
		inProcess bool
		want      []string
	}{
		{"hub", false, false, []string{"credentials", "custody", "store", "sockets", "notify", "exe helper", "agy helper", "session dirs", "sandbox", "servers"}},
		{"leaf", true, false, []string{"credentials", "store", "sockets", "notify", "sandbox", "servers"}},
		{"hub in-process", false, true, []string{"credentials", "custody", "store", "sockets", "servers"}},
		{"leaf in-process", true, true, []string{"credentials", "store", "sockets", "servers"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := New(Config{Config: &config.Config{Leaf: tc.leaf}, InProcess: tc.inProcess})
			defer d.Close()
			if got := names(d.steps()); !slices.Equal(got, tc.want) {
				t.Fatalf("steps: got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLeafNamesOnlyStepsThatExist: each step leaf mode replaces is a step of the daemon, so a
// renamed step cannot leave a leaf running the hub's version (its sandbox, its sockets).
func TestLeafNamesOnlyStepsThatExist(t *testing.T) {
	d := New(Config{Config: &config.Config{Leaf: true}})
	defer d.Close()
	hub := names((&Daemon{c: Config{Config: &config.Config{}}}).steps())
	for name, run := range d.leaf.own() {
		if !slices.Contains(hub, name) {
			t.Errorf("leaf replaces %q, which is no step of the daemon (%v)", name, hub)
		}
		for _, s := range d.steps() {
			if s.name == name && run == nil {
				t.Errorf("leaf drops %q, but it still runs", name)
			}
		}
	}
}
