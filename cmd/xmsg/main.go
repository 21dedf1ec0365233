// Command xmsg is the per-user local message bus: `xmsg serve` runs the daemon, `xmsg mcp` is
// the MCP bridge for agent sessions, and list/send/replies/doctor are for people and scripts.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/xmsg/xmsg/internal/agy"
	"github.com/xmsg/xmsg/internal/bench"
	"github.com/xmsg/xmsg/internal/exehelper"
	"github.com/xmsg/xmsg/internal/relaunch"
)

// Exit codes scripts can branch on.
const (
	exitOK       = 0
	exitFailure  = 1 // the bus could not be reached, or the daemon failed
	exitUsage    = 2 // bad command line
	exitRefused  = 3 // the bus refused the request (4xx: bad input, not found, conflict, ...)
	exitBusError = 4 // the bus failed the request (5xx)
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `usage: xmsg <command> [flags]

commands:
  serve      run the bus daemon (xmsg serve --help lists every flag)
  mcp        MCP bridge on stdin/stdout for an agent session
  list       list live sessions
  send       send a message: xmsg send REF TEXT (TEXT "-" reads stdin)
  replies    show replies to a message: xmsg replies ID [--wait S] [--after N]
  doctor     show which protections are in force
  health     exit 0 when the running daemon answers /healthz with 200 (a container probe)
  register   register agy [--hook] [--sock P] [--url U]: the Antigravity hook helper
  exec       exec --credential NAME[=ENVVAR] [--fd N] -- CMD: run CMD with a custody secret as a descriptor
  bench      measure the bus end to end (xmsg bench --help)
  version    print the version

exit codes: 0 ok, 1 bus unreachable or failed, 2 usage, 3 refused by the bus (4xx), 4 bus error (5xx)
`

// usageError is a bad command line: exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// exitError carries a specific exit code.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }

// silentExit ends the process with a status and no line of its own: a daemon that waited in
// its successor's place (internal/relaunch) ends with that one's status, which said what it had
// to say itself.
type silentExit int

func (e silentExit) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func main() {
	err := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	if err == nil {
		return
	}
	var se silentExit
	if errors.As(err, &se) {
		os.Exit(int(se))
	}
	code := exitFailure
	var ue usageError
	var ee exitError
	switch {
	case errors.As(err, &ue):
		code = exitUsage
	case errors.As(err, &ee):
		code = ee.code
	}
	fmt.Fprintln(os.Stderr, "xmsg: "+err.Error())
	os.Exit(code)
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{"no command given"}
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(rest, stdout)
	case "mcp":
		return mcpCmd(rest, stdin, stdout)
	case "list":
		return listCmd(rest, stdout)
	case "send":
		return sendCmd(rest, stdin, stdout)
	case "replies":
		return repliesCmd(rest, stdout)
	case "doctor":
		return doctorCmd(rest, stdout)
	case "health":
		return healthCmd(rest, stdout)
	case "bench":
		return benchCmd(rest, stdout, stderr)
	case bench.RoleArg:
		// The child processes (fake sessions, services) that bench starts.
		return bench.Role(rest)
	case relaunch.Arg:
		// The handover helper that serve starts before it applies Landlock; it ends with the
		// status of the last daemon it started.
		code, err := relaunch.RunHelper(rest)
		if err == nil && code != 0 {
			return silentExit(code)
		}
		return err
	case exehelper.Arg:
		// The attestation helper that serve starts before it applies Landlock.
		return exehelper.Serve()
	case agy.HelperArg:
		// The agentapi helper that serve starts before it applies Landlock.
		if len(rest) != 1 {
			return usageError{"agy helper: want the agy program"}
		}
		return agy.ServeHelper(rest[0])
	case "register":
		return registerCmd(rest, stdin, stdout, stderr)
	case "exec":
		return execCmd(rest)
	case "version", "--version":
		fmt.Fprintln(stdout, "xmsg", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return usageError{fmt.Sprintf("unknown command %q", cmd)}
}
