package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/xmsg/xmsg/internal/bench"
)

const benchAbout = `Measures xmsg end to end: by default it starts a daemon of its own on temporary paths (in its
own process), real child processes as Claude sessions and services, and clients on the real
sockets. Every latency comes with the same run's fsync and bbolt-commit baselines and the
ratio to them; a latency path's baselines are taken between its own sends (in ten slices),
since the disk's latency drifts within a run. Each path also shows the whole machine's busy CPU
per operation (every process, from /proc/stat): with the CPU count it bounds the throughput the
machine can give that path. After the table come the project's performance goals the run
speaks to, each a figure of every run (a ratio to the same run's baselines or to another of its
paths where it can be), its median and range, and whether it is met in every run, at the
median, or not. A progress line is kept on stderr; the result goes to stdout.

With --sock it measures a running daemon instead: the Claude paths need --sessions-dir (that
daemon's session directory; the fake sessions remove their files when they end), the service
paths --svc (a service whose trusted executable is this xmsg); the growth paths are skipped.
The baselines are measured in $TMPDIR: point it at the daemon's filesystem to compare like
with like. Daemon CPU per operation is reported only for a daemon of its own.

With --leaf it measures the leaf path instead: a hub and a leaf daemon of its own (pinned mTLS
on loopback, default limits), senders on the hub's http.sock, one service draining on the
leaf's register socket, against the same service draining on the hub in the same run. With
--leaves N (N > 1) it starts N leaf daemons and adds a path whose senders spread their messages
over all of them, each leaf's service draining; its "daemon CPU/op" is the hub's and "leaf
CPU/op" the leaves' together, per message, beside the hub's own service path. On one machine
the leaves' commits share the hub's disk and slow its commits; --leaf-state DIR on another
filesystem (a second disk, or tmpfs to leave the disk out) keeps the leaves' stores there.
`

func benchFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	var o bench.Options
	fs.StringVar(&o.Sock, "sock", "", "http.sock of a running daemon (default: start one on temporary paths)")
	fs.StringVar(&o.AgentSock, "agent-sock", "", "with --sock: its agent.sock (default: next to --sock)")
	fs.StringVar(&o.RegisterSock, "register-sock", "", "with --sock: its register.sock (default: next to --sock)")
	fs.StringVar(&o.SessionsDir, "sessions-dir", "", "with --sock: its Claude session directory")
	fs.StringVar(&o.Service, "svc", "", "with --sock: a service name whose trusted executable is this xmsg")
	fs.IntVar(&o.Count, "count", 2000, "sends per latency path (throughput paths send 4x this)")
	fs.IntVar(&o.Clients, "clients", 64, "concurrent clients")
	fs.IntVar(&o.Services, "services", 64, "registered services, each with its consumer")
	fs.IntVar(&o.Stale, "stale", 10000, "stale session files for the growth path")
	fs.IntVar(&o.Runs, "runs", 3, "runs (figures are medians with the range over the runs)")
	fs.IntVar(&o.Size, "size", 200, "message text bytes")
	leafPath := fs.Bool("leaf", false, "measure hub -> leaf -> service (two daemons of its own) instead")
	fs.IntVar(&o.Leaves, "leaves", 1, "with --leaf: leaf daemons (each its own process and certificate); more than one adds the path through all of them")
	fs.StringVar(&o.LeafState, "leaf-state", "", "with --leaf: a directory for the leaves' stores (another filesystem: a disk of their own, as on other machines; default beside the hub's)")
	fs.StringVar(&o.Only, "only", "", "run only the paths whose name contains this text (a growth figure only when both of its paths run)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	quiet := fs.Bool("quiet", false, "no progress line")
	return func(pos []string) error {
		if len(pos) > 0 {
			return usageError{"bench takes no arguments"}
		}
		if !*leafPath && o.Leaves != 1 {
			// A flag that cannot apply is refused rather than ignored.
			return usageError{"--leaves applies to --leaf only"}
		}
		if o.LeafState != "" {
			if !*leafPath {
				return usageError{"--leaf-state applies to --leaf only"}
			}
			if st, err := os.Stat(o.LeafState); err != nil || !st.IsDir() {
				return usageError{fmt.Sprintf("--leaf-state %q is not a directory", o.LeafState)}
			}
		}
		return runBench(o, *leafPath, *asJSON, *quiet, s.out, s.err)
	}
}

func runBench(o bench.Options, leafPath, asJSON, quiet bool, stdout, stderr io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	o.Self, o.Env = self, os.Environ()
	if !quiet {
		o.Progress = stderr
	}
	interrupt := make(chan os.Signal, 1)
	signal.Notify(interrupt, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(interrupt)
	o.Interrupt = interrupt
	run := bench.RunBench
	if leafPath {
		run = bench.RunLeaf
	}
	res, err := run(o)
	if err != nil {
		return err
	}
	if o.Only != "" && len(res.Runs) > 0 && len(res.Runs[0].Figures) == 0 {
		// Not a result with no rows: the names to match are the paths column of a run without it.
		return usageError{fmt.Sprintf("--only %q matches no path of this bench (see the path column of a run without --only)", o.Only)}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	res.Text(stdout)
	return nil
}
