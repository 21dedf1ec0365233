package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/xmsg/xmsg/internal/doctor"
)

const doctorAbout = `Shows what this machine offers (Landlock, pidfd, ...) and, when a daemon answers, its version,
uptime and the protections it has in force. Exit 1 when no daemon answers.
`

// runningFacts is what /healthz says about the daemon itself.
type runningFacts struct {
	Version string `json:"version"`
	Uptime  *int64 `json:"uptime_s"`
	PID     int    `json:"pid"`
}

func (f runningFacts) line() string {
	v := f.Version
	if v == "" {
		v = "unknown (a daemon older than its client)"
	}
	s := "version " + v
	if f.Uptime != nil {
		s += ", up " + (time.Duration(*f.Uptime) * time.Second).String()
	}
	if f.PID > 0 {
		s += fmt.Sprintf(", pid %d", f.PID)
	}
	return s
}

// doctorFlags: doctor prints what this machine offers and, when a daemon answers on
// http.sock, what the running instance has in force.
func doctorFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	sock, asJSON := clientFlags(fs)
	// A leaf has no http.sock: its running facts are on its TCP listener (--listen).
	tcpURL := tcpURLFlag(fs, "a leaf serves one")
	return func(pos []string) error {
		if len(pos) > 0 {
			return usageError{"doctor takes no arguments"}
		}
		machine := doctor.Machine().Lines()
		var running struct {
			Lines []string `json:"lines"`
		}
		var facts runningFacts
		c, runErr := runningClient(*tcpURL, *sock)
		if runErr == nil {
			runErr = c.do("GET", "/healthz", nil, &facts)
		}
		if runErr == nil {
			runErr = c.do("GET", "/v1/doctor", nil, &running)
		}
		if *asJSON {
			out := map[string]any{"machine": machine, "running": running.Lines}
			if runErr != nil {
				out["runningError"] = runErr.Error()
			} else {
				out["daemon"] = facts
			}
			printJSON(s.out, out)
		} else {
			fmt.Fprintln(s.out, "machine:")
			for _, l := range machine {
				fmt.Fprintln(s.out, "  "+l)
			}
			fmt.Fprintln(s.out, "running instance:")
			if runErr == nil {
				fmt.Fprintln(s.out, "  "+facts.line())
				for _, l := range running.Lines {
					fmt.Fprintln(s.out, "  "+l)
				}
			} else {
				fmt.Fprintln(s.out, "  not reachable")
			}
		}
		if runErr != nil {
			// Nothing runs: what is in force cannot be told, and a script must see that.
			return exitError{exitFailure, runErr}
		}
		return nil
	}
}
