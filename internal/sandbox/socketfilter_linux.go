//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The socket filter closes the gap in Landlock's network rules (see the package
// documentation): they govern plain TCP only, so an AF_INET/AF_INET6 socket of any other
// kind (Multipath TCP, UDP before ABI 10, SCTP, ICMP) would bypass them. The filter lets
// such sockets be created only as plain TCP and refuses io_uring, which can create sockets
// without a socket(2) system call. Other address families are left to the systemd units
// (RestrictAddressFamilies=).

// Offsets into struct seccomp_data. The argument offsets address the low 32 bits of each
// 64-bit argument, which is where they are on the little-endian architectures that
// filterArch accepts; the kernel reads domain, type and protocol as ints.
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16 // domain
	offArg1 = 24 // type, with SOCK_NONBLOCK/SOCK_CLOEXEC flags
	offArg2 = 32 // protocol
)

// x32SyscallBit marks x32 system calls on amd64. They share AUDIT_ARCH_X86_64 but have
// their own socket number, so they are refused outright (Go never makes them).
const x32SyscallBit = 0x40000000

// sockTypeMask separates the socket type from its flags (SOCK_TYPE_MASK in the kernel).
const sockTypeMask = 0xf

// filterArch returns the audit architecture the filter checks, and false where the filter
// is not supported (big-endian or socketcall(2) architectures).
func filterArch() (uint32, bool) {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64, true
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64, true
	case "riscv64":
		return unix.AUDIT_ARCH_RISCV64, true
	}
	return 0, false
}

func archName() string { return runtime.GOARCH }

// insn is one classic BPF instruction whose jump targets are labels ("" = next).
type insn struct {
	label  string // this instruction's label, if a jump targets it
	code   uint16
	k      uint32
	jt, jf string
}

func ld(off uint32) insn { return insn{code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, k: off} }
func jeq(k uint32, jt, jf string) insn {
	return insn{code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, k: k, jt: jt, jf: jf}
}
func jge(k uint32, jt, jf string) insn {
	return insn{code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, k: k, jt: jt, jf: jf}
}
func and(k uint32) insn { return insn{code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, k: k} }
func ret(label string, k uint32) insn {
	return insn{label: label, code: unix.BPF_RET | unix.BPF_K, k: k}
}
func labeled(label string, i insn) insn { i.label = label; return i }

// socketFilter returns the seccomp program for the given audit architecture.
func socketFilter(arch uint32, x32 bool) ([]unix.SockFilter, error) {
	prog := []insn{
		// A system call of another architecture (i386 via int 0x80 on amd64) has other
		// numbers and socketcall(2); Go never makes one, so refuse them all.
		ld(offArch),
		jeq(arch, "", "nosys"),
		ld(offNr),
	}
	if x32 {
		prog = append(prog, jge(x32SyscallBit, "nosys", ""))
	}
	prog = append(prog,
		// io_uring can create sockets (IORING_OP_SOCKET) without passing this filter.
		jeq(unix.SYS_IO_URING_SETUP, "nosys", ""),
		jeq(unix.SYS_SOCKET, "", "allow"),
		ld(offArg0),
		jeq(unix.AF_INET, "inet", ""),
		jeq(unix.AF_INET6, "inet", "allow"),
		// An Internet socket must be a stream socket of protocol 0 or IPPROTO_TCP:
		// plain TCP, the only kind Landlock's TCP rules govern.
		labeled("inet", ld(offArg1)),
		and(sockTypeMask),
		jeq(unix.SOCK_STREAM, "", "eacces"),
		ld(offArg2),
		jeq(0, "allow", ""),
		jeq(unix.IPPROTO_TCP, "allow", "eacces"),
		ret("allow", unix.SECCOMP_RET_ALLOW),
		// EACCES, as Landlock answers: Go's net package then falls back from Multipath
		// TCP to plain TCP, and errors read "permission denied".
		ret("eacces", unix.SECCOMP_RET_ERRNO|uint32(unix.EACCES)),
		// ENOSYS: "this kernel has no such call", which callers handle as absent.
		ret("nosys", unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS)),
	)
	return assemble(prog)
}

// assemble resolves labels into the relative jump offsets of classic BPF.
func assemble(prog []insn) ([]unix.SockFilter, error) {
	at := map[string]int{}
	for i, in := range prog {
		if in.label != "" {
			at[in.label] = i
		}
	}
	offset := func(from int, label string) (uint8, error) {
		if label == "" {
			return 0, nil
		}
		to, ok := at[label]
		if !ok || to <= from || to-from-1 > 255 {
			return 0, fmt.Errorf("sandbox: socket filter: bad jump to %q", label)
		}
		return uint8(to - from - 1), nil
	}
	out := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		jt, err := offset(i, in.jt)
		if err != nil {
			return nil, err
		}
		jf, err := offset(i, in.jf)
		if err != nil {
			return nil, err
		}
		out[i] = unix.SockFilter{Code: in.code, Jt: jt, Jf: jf, K: in.k}
	}
	return out, nil
}

// installSocketFilter installs the filter on every thread of the process
// (SECCOMP_FILTER_FLAG_TSYNC); threads created later inherit it.
func installSocketFilter() error {
	arch, ok := filterArch()
	if !ok {
		return errors.New("sandbox: socket filter: unsupported architecture " + runtime.GOARCH)
	}
	prog, err := socketFilter(arch, runtime.GOARCH == "amd64")
	if err != nil {
		return err
	}
	return installSeccomp(prog)
}

// installSeccomp installs a seccomp program on every thread of the process.
func installSeccomp(prog []unix.SockFilter) error {
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}

	// no_new_privs must be set on the thread that installs the filter; TSYNC then sets
	// it on every other thread too.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("sandbox: prctl no_new_privs: %w", err)
	}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("sandbox: seccomp: %w", errno)
	}
	if r != 0 {
		// With TSYNC, a positive result names a thread that could not be synchronized;
		// nothing was installed.
		return fmt.Errorf("sandbox: seccomp: thread %d could not be synchronized", r)
	}
	return nil
}
