package version

import (
	"runtime/debug"
	"testing"
)

func TestString(t *testing.T) {
	rev := "0123456789abcdef0123456789abcdef01234567"
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"checkout, clean", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}}, "devel (0123456789ab)"},
		{"checkout, modified", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}}, "devel (0123456789ab+dirty)"},
		{"pseudo-version", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261204190000-0123456789ab+dirty"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}}, "v0.0.0-20261204190000-0123456789ab+dirty"},
		{"tagged", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3"},
		{"no build info", nil, "devel"},
	} {
		if got := fromBuild(c.bi, c.bi != nil).String(); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
	stamped = "1.2.3"
	defer func() { stamped = "" }()
	if got := fromBuild(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true).Version; got != "1.2.3" {
		t.Errorf("stamped: got %q, want 1.2.3", got)
	}
}
