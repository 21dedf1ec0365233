package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
)

// healthFlags: health asks the running daemon's /healthz and exits 0 only when it answers 200: the exec
// probe a kubelet runs in a container without a shell (deploy/kubernetes), and a check for
// scripts. It prints the answer (one JSON line); unreachable is exit 1, an unhealthy answer 4.
func healthFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	sock := httpSockFlag(fs)
	tcpURL := tcpURLFlag(fs, "")
	return func(pos []string) error {
		if len(pos) > 0 {
			return usageError{"health takes no arguments"}
		}
		c, err := runningClient(*tcpURL, *sock)
		if err != nil {
			return err
		}
		var h json.RawMessage
		if err := c.do("GET", "/healthz", nil, &h); err != nil {
			return err
		}
		fmt.Fprintln(s.out, string(h))
		return nil
	}
}

// runningClient is the client of the running daemon that doctor and health ask: its TCP
// listener when tcpURL (or XMSG_URL) names one, else its http.sock (the flag's, or the default).
func runningClient(tcpURL, sock string) (*busClient, error) {
	if tcpURL == "" {
		tcpURL = os.Getenv("XMSG_URL")
	}
	if tcpURL != "" {
		return newTCPBusClient(tcpURL), nil
	}
	path, err := httpSockPath(sock)
	if err != nil {
		return nil, err
	}
	return newBusClient(path), nil
}
