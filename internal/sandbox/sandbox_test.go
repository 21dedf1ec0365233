package sandbox

import (
	"strings"
	"testing"
)

func TestReportString(t *testing.T) {
	tests := []struct {
		r    Report
		want string
	}{
		{Report{ABI: 7, FS: Enforced, Net: Enforced, Scope: Enforced}, "landlock: abi=7 fs=enforced net=enforced scope=enforced"},
		{Report{ABI: 4, FS: Enforced, Net: Partial, Scope: Unavailable}, "landlock: abi=4 fs=enforced net=partial scope=unavailable"},
		{Report{ABI: 0, FS: Unavailable, Net: Unavailable, Scope: Unavailable}, "landlock: unavailable"},
		{Report{}, "landlock: unavailable"},
	}
	for _, tt := range tests {
		if got := tt.r.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.r, got, tt.want)
		}
	}
}

func TestPlan(t *testing.T) {
	tests := []struct {
		abi    int
		filter bool
		want   Report
	}{
		{0, true, Report{0, Unavailable, Unavailable, Unavailable, ""}},
		{1, true, Report{1, Partial, Unavailable, Unavailable, ""}},
		{2, true, Report{2, Partial, Unavailable, Unavailable, ""}},
		{3, true, Report{3, Enforced, Unavailable, Unavailable, ""}},
		{4, true, Report{4, Enforced, Enforced, Unavailable, ""}},
		{4, false, Report{4, Enforced, Partial, Unavailable, ""}},
		{5, true, Report{5, Enforced, Enforced, Unavailable, ""}},
		{6, true, Report{6, Enforced, Enforced, Enforced, ""}},
		{7, true, Report{7, Enforced, Enforced, Enforced, ""}},
		{7, false, Report{7, Enforced, Partial, Enforced, ""}},
		{11, true, Report{11, Enforced, Enforced, Enforced, ""}},
	}
	for _, tt := range tests {
		got := plan(tt.abi, tt.filter)
		if got != tt.want {
			t.Errorf("plan(%d, %v) = %+v, want %+v", tt.abi, tt.filter, got, tt.want)
		}
		if gotC, wantC := got.Complete(), tt.abi >= 6 && tt.filter; gotC != wantC {
			t.Errorf("plan(%d, %v).Complete() = %v, want %v", tt.abi, tt.filter, gotC, wantC)
		}
	}
}

// TestGate: --require-landlock refuses whatever the kernel cannot fully enforce, and
// names what it can.
func TestGate(t *testing.T) {
	tests := []struct {
		require bool
		r       Report
		wantErr string // "" = no error
	}{
		{true, plan(7, true), ""},
		{true, plan(5, true), "abi=5 fs=enforced net=enforced scope=unavailable"},
		{true, plan(7, false), "net=partial"},
		{true, plan(3, true), "net=unavailable"},
		{true, plan(0, true), "require-landlock: Landlock is unavailable"},
		{false, plan(0, true), ""},
		{false, plan(5, false), ""},
	}
	for _, tt := range tests {
		err := gate(Policy{Require: tt.require}, tt.r)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("gate(require=%v, %v) = %v, want nil", tt.require, tt.r, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("gate(require=%v, %v) = %v, want error containing %q", tt.require, tt.r, err, tt.wantErr)
		}
	}
}
