// Command xmsg is the per-user local message bus: `xmsg serve` runs the daemon, `xmsg mcp` is
// the MCP bridge for agent sessions, listen/reply make a session of a terminal, and
// list/send/replies/doctor are for people and scripts. commands.go holds the table of them.
package main

import (
	"errors"
	"fmt"
	"os"
)

// Exit codes scripts can branch on.
const (
	exitOK       = 0
	exitFailure  = 1 // the bus could not be reached, or the daemon failed
	exitUsage    = 2 // bad command line
	exitRefused  = 3 // the bus refused the request (4xx: bad input, not found, conflict, ...)
	exitBusError = 4 // the bus failed the request (5xx)
	exitTimeout  = 5 // replies --wait: no reply came in the time given
	// exitStoreRefused: serve refused its store file (damaged, not an xmsg store, or of a
	// newer format) and left it as it was. Starting again cannot help, so the unit's
	// RestartPreventExitStatus= names it (sysexits' EX_DATAERR).
	exitStoreRefused = 65
)

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
	// A detail can echo what the user typed (a target, a name): control characters in it are
	// shown escaped, never sent to the terminal as they are.
	fmt.Fprintln(os.Stderr, "xmsg: "+escapeControl(err.Error()))
	os.Exit(code)
}

// escapeControl is what the terminal is shown of a string that came from elsewhere (a name, a
// target, an error's detail): printable's one rule, so listen, replies, errors, monitor and
// status escape the same characters (control, format such as bidi overrides, invalid UTF-8).
func escapeControl(s string) string { return printable(s) }

// isControl is a C0 or C1 control character or DEL: no name or ref holds one.
func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }
