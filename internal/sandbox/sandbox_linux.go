//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// maxABI is the highest Landlock ABI that go-landlock v0.11.2 knows (landlock.V11). A newer
// kernel is used at this level.
const maxABI = 11

// Filesystem rights granted by the rules. Nothing else is granted anywhere: in particular
// no Execute (the daemon runs no programs after Apply), no device/FIFO/socket/symlink
// creation, no Refer (no renames across directories) and no IoctlDev.
const (
	// Reading a regular file.
	readFile landlock.AccessFSSet = ll.AccessFSReadFile
	// Reading files and listing directories: session dirs are rescanned on every request,
	// /proc/<pid>/ is read for attestation.
	readDir = readFile | ll.AccessFSReadDir
	// Reading and writing an existing file; Truncate because opening for writing and
	// growing the bbolt file are truncations in Landlock's sense.
	rwFile landlock.AccessFSSet = ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSTruncate
	// The state directory: bbolt creates its file (MakeReg); compaction or a future layout
	// may create subdirectories and remove or rename files within one directory.
	rwDir = rwFile | ll.AccessFSReadDir | ll.AccessFSMakeReg | ll.AccessFSMakeDir |
		ll.AccessFSRemoveFile | ll.AccessFSRemoveDir
	// connect(2)/sendmsg(2) on pathname Unix sockets beneath (ABI 9): the Claude inbox
	// sockets. Dropped by the best-effort downgrade on older kernels, where such connects
	// are not restricted at all.
	connectUnix landlock.AccessFSSet = ll.AccessFSResolveUnix
	// unlink(2) of files directly beneath a directory (a directory right only).
	removeFile landlock.AccessFSSet = ll.AccessFSRemoveFile
)

// installFilter is installSocketFilter; a variable so that a test can show the gap the
// filter closes.
var installFilter = installSocketFilter

// Probe returns the Landlock ABI the running kernel offers, as go-landlock will use it,
// without restricting anything: 0 when Landlock is missing, disabled at boot, or its
// system calls are refused (a seccomp filter such as systemd's SystemCallFilter=).
func Probe() int {
	v, _ := detectABI()
	return v
}

// detectABI is Probe with the reason for a 0.
func detectABI() (int, error) {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0, err
	}
	if v <= 0 {
		return 0, nil
	}
	if v >= 6 {
		// Same rule as go-landlock's internal ABI detection, so that Report matches
		// what it enforces: a kernel without the fix for the signal scoping bug
		// (erratum bit 0x2) is used at ABI 5, i.e. without scoping.
		errata, err := ll.LandlockGetErrata()
		if err != nil || errata&0x2 == 0 {
			v = 5
		}
	}
	return min(v, maxABI), nil
}

// unavailableReason explains a probe that found no Landlock.
func unavailableReason(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSYS):
		return "the kernel has no Landlock"
	case errors.Is(err, syscall.EOPNOTSUPP):
		return "Landlock is disabled at boot (lsm= kernel parameter)"
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return "the landlock system calls are refused, likely by a seccomp filter " +
			"(SystemCallFilter= must allow landlock_create_ruleset landlock_add_rule landlock_restrict_self)"
	case err != nil:
		return "landlock_create_ruleset: " + err.Error()
	}
	return "the kernel has no Landlock"
}

// Apply restricts the whole process (all threads, now and later) to p and returns what is
// enforced. The caller logs Report.String() once at startup.
//
// Outcomes:
//   - nil error: the returned Report is in force; in best-effort mode it may contain
//     Partial or Unavailable parts, which are logged here too.
//   - error with p.Require and an incomplete kernel: nothing was restricted.
//   - any other error (a relative path, an unreadable path, a kernel refusal): the process
//     may be partly restricted; the caller must not go on serving.
//
// Paths that do not exist are skipped with a log line: a Landlock rule is made from an
// open file descriptor, so a path that cannot be opened stays inaccessible. A directory
// created after Apply is therefore not reachable until the daemon restarts.
func Apply(p Policy, log *slog.Logger) (Report, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	abi, perr := detectABI()
	_, filterOK := filterArch()
	want := plan(abi, filterOK)
	if err := gate(p, want); err != nil {
		if abi == 0 {
			err = fmt.Errorf("%w: %s", err, unavailableReason(perr))
		}
		return Report{}, err
	}
	if abi == 0 {
		log.Warn("landlock unavailable", "reason", unavailableReason(perr))
		return want, nil
	}

	rules, err := rulesFor(p, log)
	if err != nil {
		return Report{}, err
	}

	got := want
	if abi >= 4 {
		got.TCP = tcpNote(p)
		switch {
		case !filterOK:
			log.Warn("socket filter unsupported", "arch", archName(),
				"reason", "multipath TCP sockets escape Landlock's TCP rules")
		default:
			// Installed first: if Landlock then fails, the caller exits anyway.
			if err := installFilter(); err != nil {
				if p.Require {
					return Report{}, fmt.Errorf("sandbox: socket filter: %w", err)
				}
				// EPERM here usually means SystemCallFilter= lacks seccomp.
				log.Warn("socket filter not installed", "err", err,
					"reason", "multipath TCP sockets escape Landlock's TCP rules")
				got.Net = Partial
			}
		}
	}

	// V11 in best-effort mode: the highest ABI go-landlock knows, downgraded to what the
	// kernel offers. It handles every filesystem right, TCP (and from ABI 10 UDP) bind and
	// connect, and both IPC scopes, so whatever no rule above allows is refused.
	if err := landlock.V11.BestEffort().Restrict(rules...); err != nil {
		return Report{}, fmt.Errorf("sandbox: landlock restrict: %w", err)
	}
	for _, k := range [...]struct{ kind, status string }{{"fs", got.FS}, {"net", got.Net}, {"scope", got.Scope}} {
		if k.status != Enforced {
			log.Warn("landlock incomplete", "kind", k.kind, "status", k.status, "abi", abi)
		}
	}
	return got, nil
}

// rulesFor turns p into go-landlock rules. Every rule exists for one reason, given with it.
func rulesFor(p Policy, log *slog.Logger) ([]landlock.Rule, error) {
	var rules []landlock.Rule
	add := func(paths []string, kind string, dirRights, fileRights landlock.AccessFSSet) error {
		for _, path := range paths {
			r, ok, err := pathRule(path, dirRights, fileRights)
			if err != nil {
				return err
			}
			if !ok {
				log.Warn("landlock path skipped", "path", path, "access", kind,
					"reason", "does not exist; a Landlock rule needs an open file descriptor, so it stays inaccessible")
				continue
			}
			rules = append(rules, r)
		}
		return nil
	}
	// The state dir: the only place the daemon writes.
	if err := add(p.ReadWrite, "read_write", rwDir, rwFile); err != nil {
		return nil, err
	}
	// /proc (attestation), session dirs (discovery), credentials (reload): read only.
	if err := add(p.ReadOnly, "read_only", readDir, readFile); err != nil {
		return nil, err
	}
	// The self-bound socket directory: removing the socket files at stop, nothing else (no
	// reading, no creating: a file planted there stays out of reach).
	if err := add(p.RemoveFiles, "remove_file", removeFile, removeFile); err != nil {
		return nil, err
	}
	// Inbox sockets of Claude sessions: connect only, no read or write of files there.
	if err := add(p.ConnectUnix, "connect_unix", connectUnix, connectUnix); err != nil {
		return nil, err
	}
	// The federation listener's port: the only TCP port the daemon may bind.
	for _, port := range p.BindTCP {
		rules = append(rules, landlock.BindTCP(port))
	}
	// Configured federation peers: the only TCP ports the daemon may connect to.
	// Landlock matches the port only, not the address.
	for _, port := range p.ConnectTCP {
		rules = append(rules, landlock.ConnectTCP(port))
	}
	// No rule for abstract Unix sockets or signals: the V11 config scopes both, so the
	// daemon can reach neither a process outside its sandbox.
	return rules, nil
}

// pathRule builds the rule for one path: dirRights when it is a directory, fileRights
// otherwise (Landlock refuses directory rights on a file). ok is false when the path does
// not exist.
func pathRule(path string, dirRights, fileRights landlock.AccessFSSet) (r landlock.Rule, ok bool, err error) {
	if !filepath.IsAbs(path) {
		return nil, false, fmt.Errorf("sandbox: path %q is not absolute", path)
	}
	// Stat follows symlinks, like the O_PATH open that go-landlock does for the rule.
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("sandbox: stat: %w", err)
	}
	rights := fileRights
	if fi.IsDir() {
		rights = dirRights
	}
	// IgnoreIfMissing: removed between the stat and go-landlock's open means no access,
	// which is the safe outcome.
	return landlock.PathAccess(rights, path).IgnoreIfMissing(), true, nil
}
