package main

import (
	"fmt"
	"io"

	"github.com/xmsg/xmsg/internal/doctor"
)

// doctorCmd prints what this machine offers and, when a daemon answers on http.sock, what
// the running instance has in force.
func doctorCmd(args []string, stdout io.Writer) error {
	fs, sock, asJSON := clientFlags("doctor")
	// A leaf has no http.sock: its running facts are on its TCP listener (--listen).
	tcpURL := fs.String("url", "", "ask the daemon on this TCP listener instead of http.sock, e.g. http://127.0.0.1:7787 (a leaf; env XMSG_URL)")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	machine := doctor.Machine().Lines()
	var running struct {
		Lines []string `json:"lines"`
	}
	c, runErr := runningClient(*tcpURL, *sock)
	if runErr == nil {
		runErr = c.do("GET", "/v1/doctor", nil, &running)
	}
	if *asJSON {
		out := map[string]any{"machine": machine, "running": running.Lines}
		if runErr != nil {
			out["runningError"] = runErr.Error()
		}
		return printJSON(stdout, out)
	}
	fmt.Fprintln(stdout, "machine:")
	for _, l := range machine {
		fmt.Fprintln(stdout, "  "+l)
	}
	fmt.Fprintln(stdout, "running instance:")
	if runErr != nil {
		fmt.Fprintln(stdout, "  not reachable: "+runErr.Error())
		return nil
	}
	for _, l := range running.Lines {
		fmt.Fprintln(stdout, "  "+l)
	}
	return nil
}
