package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// healthCmd asks the running daemon's /healthz and exits 0 only when it answers 200: the exec
// probe a kubelet runs in a container without a shell (deploy/kubernetes), and a check for
// scripts. It prints the answer (one JSON line); unreachable is exit 1, an unhealthy answer 4.
func healthCmd(args []string, stdout io.Writer) error {
	fs, sock, _ := clientFlags("health")
	tcpURL := fs.String("url", "", "ask the daemon on this TCP listener instead of http.sock (env XMSG_URL)")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *tcpURL == "" {
		*tcpURL = os.Getenv("XMSG_URL")
	}
	var c *busClient
	if *tcpURL != "" {
		c = newTCPBusClient(*tcpURL)
	} else {
		path, err := httpSockPath(*sock)
		if err != nil {
			return err
		}
		c = newBusClient(path)
	}
	var h json.RawMessage
	if err := c.do("GET", "/healthz", nil, &h); err != nil {
		return err
	}
	fmt.Fprintln(stdout, string(h))
	return nil
}
