package doctor

import (
	"os"
	"strings"
)

// PtraceScope describes Yama's kernel.yama.ptrace_scope, which decides whether a process of
// the same uid may attach to a custody recipient and read its secret (docs/security.md §11).
func PtraceScope() string {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		return "no Yama: any process of the uid may ptrace another (custody recipients included)"
	}
	switch v := strings.TrimSpace(string(b)); v {
	case "0":
		return "yama ptrace_scope 0: any process of the uid may ptrace another (custody recipients included)"
	case "1":
		return "yama ptrace_scope 1: only an ancestor (or a declared tracer) may ptrace a process"
	case "2":
		return "yama ptrace_scope 2: only CAP_SYS_PTRACE may ptrace"
	case "3":
		return "yama ptrace_scope 3: no process may ptrace"
	default:
		return "yama ptrace_scope " + v
	}
}
