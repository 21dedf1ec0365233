// Package sandbox restricts the running xmsg daemon with Landlock (docs/design.md §6).
//
// Apply is called once, after the sockets, the store and the sd_notify socket are open
// (docs/design.md §2 step 5): Landlock only governs what is opened, connected or bound after it,
// so the file descriptors the daemon already holds keep working.
//
// What the policy allows, and nothing else:
//
//   - read and write beneath Policy.ReadWrite (the state directory holding the bbolt file);
//   - read beneath Policy.ReadOnly (/proc for attestation, the Claude session directories,
//     $CREDENTIALS_DIRECTORY);
//   - connect(2) to pathname Unix sockets beneath Policy.ConnectUnix (the Claude inbox
//     sockets), which Landlock can only express from ABI 9 (before that such connects are
//     not restricted by Landlock at all);
//   - TCP bind(2) on Policy.BindTCP and TCP connect(2) to Policy.ConnectTCP (ABI 4). Landlock
//     matches ports, not addresses. No UDP: Landlock refuses all UDP from ABI 10, and the
//     socket filter below refuses it on every ABI, so the daemon behaves the same on all
//     kernels;
//   - no abstract Unix socket connections and no signals to processes outside the sandbox
//     (ABI 6).
//
// Landlock's TCP rules do not cover Multipath TCP sockets, which Go's net.Listen uses by
// default since Go 1.24 (https://github.com/landlock-lsm/linux/issues/54): an MPTCP socket
// could bind or connect to any port. Checked on this project's kernel (6.18, ABI 7): it
// can. So whenever Landlock restricts TCP, Apply also installs a small seccomp filter that
// lets AF_INET/AF_INET6 sockets be created only as plain TCP, and refuses io_uring (whose
// IORING_OP_SOCKET would create sockets without passing seccomp). Go's net package falls
// back to plain TCP when an MPTCP socket cannot be created, and plain TCP is what Landlock
// governs. Without that filter the network is reported "partial".
//
// Every restriction applies to the whole process: go-landlock enforces the ruleset on all
// OS threads (libpsx or syscall.AllThreadsSyscall before ABI 8, LANDLOCK_RESTRICT_SELF_TSYNC
// from ABI 8) and the seccomp filter is installed with SECCOMP_FILTER_FLAG_TSYNC. Threads
// created later inherit both. There is no way back: neither can be lifted.
//
// Best effort is the default: the highest ABI the kernel offers is used and whatever it
// cannot enforce is reported in Report, not treated as an error. Policy.Require turns that
// into a refusal to run (--require-landlock).
package sandbox

import (
	"errors"
	"fmt"
	"strings"
)

// Status of one kind of restriction, as reported in Report.
const (
	Enforced    = "enforced"    // fully in force
	Partial     = "partial"     // in force, with a gap named in the package documentation
	Unavailable = "unavailable" // not in force: the kernel cannot do it
)

// Policy says what the daemon may still do after Apply. Everything else of the kinds that
// Landlock handles is refused.
type Policy struct {
	// ReadWrite: the state directory (the bbolt file lives there). Files and directories
	// beneath may be read, written, created, truncated, renamed and removed.
	ReadWrite []string
	// ReadOnly: /proc (peer attestation), the Claude session directories,
	// $CREDENTIALS_DIRECTORY. Files beneath may be read and directories listed.
	ReadOnly []string
	// RemoveFiles: directories where files may only be removed, nothing else: the directory
	// of the self-bound sockets, whose files the daemon removes at stop.
	RemoveFiles []string
	// ConnectUnix: directories holding pathname Unix sockets the daemon connects to
	// after Apply (the Claude inbox sockets). Enforced from ABI 9; below that Landlock
	// does not restrict such connects.
	ConnectUnix []string
	// BindTCP: only the federation listener port, if any. Listeners bound before Apply
	// need no rule; this is for re-binding.
	BindTCP []uint16
	// ConnectTCP: only the ports of configured federation peers.
	ConnectTCP []uint16
	// Require (--require-landlock): refuse, with an error and before restricting
	// anything, unless the filesystem, network and scope restrictions can all be
	// fully enforced.
	Require bool
}

// Report says which restrictions are in force. Each of FS, Net and Scope is Enforced,
// Partial or Unavailable; ABI is the Landlock ABI used (0: none).
//
//   - FS: Enforced from ABI 3 (reads, writes and truncation are all governed); Partial at
//     ABI 1-2 (truncate(2) is not).
//   - Net: Enforced from ABI 4 when the socket filter is installed too; Partial when it
//     could not be (Multipath TCP escapes Landlock's TCP rules).
//   - Scope: Enforced from ABI 6 (abstract Unix sockets and signals).
type Report struct {
	ABI   int
	FS    string
	Net   string
	Scope string
	// TCP names the TCP ports still allowed when Net is in force and the policy allows
	// any (federation), e.g. "tcp_bind=7443 tcp_connect=7443,7444"; "" = none.
	TCP string
}

// String is the line the daemon logs at startup and `xmsg doctor` prints, for example
// "landlock: abi=7 fs=enforced net=enforced scope=enforced", or "landlock: unavailable".
// With federation the ports left open follow: "... scope=enforced tcp_bind=7443
// tcp_connect=7443".
func (r Report) String() string {
	if r.ABI == 0 {
		return "landlock: unavailable"
	}
	s := fmt.Sprintf("landlock: abi=%d fs=%s net=%s scope=%s", r.ABI, r.FS, r.Net, r.Scope)
	if r.TCP != "" {
		s += " " + r.TCP
	}
	return s
}

// tcpNote names the TCP ports a policy allows, for Report.TCP.
func tcpNote(p Policy) string {
	ports := func(ps []uint16) string {
		out := make([]string, len(ps))
		for i, v := range ps {
			out[i] = fmt.Sprint(v)
		}
		return strings.Join(out, ",")
	}
	var parts []string
	if len(p.BindTCP) > 0 {
		parts = append(parts, "tcp_bind="+ports(p.BindTCP))
	}
	if len(p.ConnectTCP) > 0 {
		parts = append(parts, "tcp_connect="+ports(p.ConnectTCP))
	}
	return strings.Join(parts, " ")
}

// Complete reports whether every restriction is fully enforced, which is what
// Policy.Require demands.
func (r Report) Complete() bool {
	return r.FS == Enforced && r.Net == Enforced && r.Scope == Enforced
}

// plan is the Report that applying a policy at the given Landlock ABI yields, where
// filter says whether the socket filter can be installed.
func plan(abi int, filter bool) Report {
	r := Report{ABI: abi, FS: Unavailable, Net: Unavailable, Scope: Unavailable}
	switch {
	case abi >= 3:
		r.FS = Enforced
	case abi >= 1:
		r.FS = Partial // truncate(2) is governed only from ABI 3
	}
	if abi >= 4 {
		r.Net = Partial // Multipath TCP sockets escape the TCP rules
		if filter {
			r.Net = Enforced
		}
	}
	if abi >= 6 {
		r.Scope = Enforced
	}
	return r
}

// gate refuses a Require policy when the planned Report is incomplete. It runs before
// anything is restricted: --require-landlock promises that the daemon never serves with
// less than the full sandbox, so it must fail closed and say what is missing.
func gate(p Policy, want Report) error {
	switch {
	case !p.Require || want.Complete():
		return nil
	case want.ABI == 0:
		return errors.New("sandbox: require-landlock: Landlock is unavailable")
	}
	return fmt.Errorf("sandbox: require-landlock: kernel can enforce only %s",
		strings.TrimPrefix(want.String(), "landlock: "))
}
