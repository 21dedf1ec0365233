// Package exehelper answers "which executable runs pid N" and "which files does pid N hold
// open" for a daemon that Landlock confines.
//
// Landlock forbids a sandboxed process to ptrace processes outside its domain, and reading
// /proc/<pid>/exe is a ptrace-mode access: once `xmsg serve` is sandboxed, it can no longer
// read the exe link of the service processes it must attest (it can still read
// /proc/<pid>/stat); /proc/<pid>/fd, which Codex and Antigravity attestation read, is the same
// kind of access. So before the sandbox applies, serve starts this helper: a child that stays
// outside the Landlock domain and answers three read-only questions on a socketpair that is its
// only channel: read a pid, answer peercred.Proc.Exe(pid), peercred.Proc.OpenFiles(pid) or
// peercred.Proc.ExeDigest(pid) (the executable and the SHA-256 of the running file, which a
// Codex app-server copy is attested by). It dies with its parent
// (PDEATHSIG) and when the socketpair closes. If it is gone, attestation fails closed.
package exehelper

// Arg is the hidden subcommand that runs the helper loop.
const Arg = "__exe-helper"
