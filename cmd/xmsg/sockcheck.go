package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// unreachable explains why a request to the bus failed, in the terms a user can act on. The
// daemon's peer gate closes a connection from another uid before reading a byte, which a
// client sees as a bare EOF: the socket's owner, read by stat, names that case. A socket of
// another kind (agent.sock where http.sock was meant) answers in JSON lines, which an HTTP
// client reports as a malformed status: the socket is asked what it is, and named.
func (c *busClient) unreachable(err error, want string) error {
	if c.base == "" {
		if why := ownerRefusal(c.sock); why != "" {
			return errors.New(why)
		}
		if strings.Contains(err.Error(), "malformed HTTP") {
			return fmt.Errorf("%s is not an http.sock: %s", c.sock, socketKind(c.sock, want))
		}
	}
	return fmt.Errorf("cannot reach the bus at %s: %v", c.sock, err)
}

// ownerRefusal is the refusal a socket (or its directory) owned by another uid gets from the
// peer gate, named; "" when both are ours or cannot be read at all.
func ownerRefusal(sock string) string {
	me := os.Getuid()
	for _, p := range []string{sock, filepath.Dir(sock)} {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		if uid, ok := fileOwner(fi); ok && uid != me {
			return fmt.Sprintf("refused: %s is owned by uid %d, you are uid %d (a bus serves only its own user; run xmsg as uid %d, or use your own bus)", p, uid, me, uid)
		}
	}
	return ""
}

// socketKind asks a JSON-lines socket what it is: register.sock answers a credential check,
// agent.sock refuses it as an unknown action. want is the socket the command needed.
func socketKind(sock, want string) string {
	kind := "a socket that answers JSON lines (agent.sock or register.sock)"
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err == nil {
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		io.WriteString(c, `{"action":"check","conversation_id":"xmsg-cli-probe"}`+"\n")
		line, _ := bufio.NewReader(io.LimitReader(c, 1<<16)).ReadString('\n')
		switch {
		case strings.Contains(line, "hasCredentials"):
			kind = "register.sock"
		case strings.HasPrefix(line, "{"):
			kind = "agent.sock"
		}
	}
	return fmt.Sprintf("this is %s, not %s (pass --%s-sock with the %s path, or leave it unset)",
		kind, want, strings.TrimSuffix(want, ".sock"), want)
}
