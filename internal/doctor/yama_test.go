package doctor

import (
	"os"
	"strings"
	"testing"
)

// TestPtraceScope: the line names the kernel's actual setting, or says Yama is absent.
func TestPtraceScope(t *testing.T) {
	got := PtraceScope()
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		if !strings.HasPrefix(got, "no Yama") {
			t.Errorf("without Yama: %q", got)
		}
		return
	}
	if want := "yama ptrace_scope " + strings.TrimSpace(string(b)); !strings.HasPrefix(got, want) {
		t.Errorf("got %q, want it to start with %q", got, want)
	}
	if l := (Facts{PtraceScope: got}).Lines(); !strings.Contains(strings.Join(l, "\n"), "ptrace: "+got) {
		t.Errorf("Lines() lacks the ptrace line: %q", l)
	}
}
