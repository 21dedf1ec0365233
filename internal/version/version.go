// Package version is the build's own account of what it is: the module version and the VCS
// revision the Go toolchain stamps into every binary built from a checkout
// (runtime/debug.ReadBuildInfo), or the string a packager sets with -ldflags. The CLI's
// --version, the MCP bridge's serverInfo and the daemon's /healthz all read it here, so the
// three never disagree.
package version

import (
	"runtime/debug"
	"strings"
)

// stamped is set by a packager: -ldflags "-X github.com/xmsg/xmsg/internal/version.stamped=1.2.3".
// It wins over the module version (a Nix build has no VCS data to read).
var stamped string

// Info is what the build says about itself.
type Info struct {
	Version  string `json:"version"`            // the stamped version, else the module version, else "devel"
	Revision string `json:"revision,omitempty"` // vcs.revision, when the build had a checkout
	Modified bool   `json:"modified,omitempty"` // vcs.modified: the checkout had changes not committed
	Time     string `json:"time,omitempty"`     // vcs.time, the revision's commit time
	Go       string `json:"go,omitempty"`       // the toolchain
}

// Get reads the build information of the running binary.
func Get() Info { return fromBuild(debug.ReadBuildInfo()) }

func fromBuild(bi *debug.BuildInfo, ok bool) Info {
	i := Info{Version: "devel"}
	if ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			i.Version = v
		}
		i.Go = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			case "vcs.time":
				i.Time = s.Value
			}
		}
	}
	if stamped != "" {
		i.Version = stamped
	}
	return i
}

// String is the one-line form: the version, then the short revision unless the version
// already names it (a pseudo-version does), with "+dirty" for a modified checkout.
func (i Info) String() string {
	s := i.Version
	if i.Revision != "" {
		short := i.Revision
		if len(short) > 12 {
			short = short[:12]
		}
		if !strings.Contains(s, short) {
			s += " (" + short
			if i.Modified {
				s += "+dirty"
			}
			s += ")"
		} else if i.Modified && !strings.Contains(s, "dirty") {
			s += "+dirty"
		}
	}
	return s
}

// String is Get().String().
func String() string { return Get().String() }
