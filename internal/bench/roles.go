package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xmsg/xmsg/internal/peercred"
)

// RoleArg is the hidden first argument with which the bench starts its child processes
// (fake Claude sessions, services) from its own executable.
const RoleArg = "__bench-role"

// Role runs one child process role: "claude DIR ID INBOX" or "svc NAME REGISTER_SOCK". A
// child says "ready" on stdout once it is addressable, then takes commands on stdin, one per
// line, and exits when stdin closes.
func Role(args []string) error {
	if len(args) < 1 {
		return errors.New("bench: role: missing role")
	}
	switch args[0] {
	case "claude":
		if len(args) != 4 {
			return errors.New("bench: role claude DIR ID INBOX")
		}
		return claudeRole(args[1], args[2], args[3])
	case "echo":
		if len(args) != 2 {
			return errors.New("bench: role echo SOCK")
		}
		return echoRole(args[1])
	case "svc":
		if len(args) == 4 && args[3] == "batch" {
			return svcRole(args[1], args[2], true)
		}
		if len(args) != 3 {
			return errors.New("bench: role svc NAME REGISTER_SOCK [batch]")
		}
		return svcRole(args[1], args[2], false)
	}
	return fmt.Errorf("bench: unknown role %q", args[0])
}

// claudeRole is a fake Claude Code session: a real session file naming this process, and a
// real inbox socket that takes one line per connection. Commands:
//
//	agent SOCK REF N SIZE   send N messages of SIZE bytes to REF over agent.sock (this
//	                        process is the attested session), print the latencies in ns
func claudeRole(dir, id, inbox string) error {
	l, err := net.Listen("unix", inbox)
	if err != nil {
		return err
	}
	defer l.Close()
	start, err := peercred.Proc{}.StartTime(os.Getpid())
	if err != nil {
		return err
	}
	raw, _ := json.Marshal(map[string]any{"pid": os.Getpid(), "sessionId": id, "name": "bench-" + id[:8], "cwd": "/", "status": "idle",
		"kind": "interactive", "startedAt": time.Now().UnixMilli(), "updatedAt": time.Now().UnixMilli(), "procStart": start, "messagingSocketPath": inbox})
	file := filepath.Join(dir, id+".json")
	tmp := filepath.Join(dir, "."+id+".tmp")
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		return err
	}
	defer os.Remove(file)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 5 || f[0] != "agent" {
			fmt.Println("error bad command")
			continue
		}
		n, _ := strconv.Atoi(f[3])
		size, _ := strconv.Atoi(f[4])
		lat, err := agentSends(f[1], f[2], n, size)
		if err != nil {
			fmt.Println("error", err)
			continue
		}
		out, _ := json.Marshal(lat)
		fmt.Println(string(out))
	}
	return nil
}

// agentSends sends n messages over one agent.sock connection and returns each round trip.
func agentSends(sock, ref string, n, size int) ([]int64, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	r := bufio.NewReader(c)
	frame, _ := json.Marshal(map[string]any{"action": "send", "ref": ref, "text": strings.Repeat("x", size), "push_replies": false})
	frame = append(frame, '\n')
	lat := make([]int64, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := c.Write(frame); err != nil {
			return nil, err
		}
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		lat = append(lat, int64(time.Since(t0)))
		if !strings.Contains(string(line), `"status":"ok"`) {
			return nil, fmt.Errorf("agent send refused: %s", strings.TrimSpace(string(line)))
		}
	}
	return lat, nil
}

// echoRole answers every line on a Unix socket with the same line: the process round trip
// that every xmsg exchange pays at least once (a baseline).
func echoRole(sock string) error {
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadBytes('\n')
					if err != nil {
						return
					}
					if _, err := c.Write(line); err != nil {
						return
					}
				}
			}()
		}
	}()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return nil
}

// svcRole is a service consumer: it registers NAME, then polls in a loop, each poll carrying
// the ack of the message the one before received (docs/protocol.md §4.2), counting what it
// receives; with batch, each poll asks for up to 64 messages and carries the acks of the
// batch before. Command "wait N": answer "reached" once N messages were received in all.
func svcRole(name, sock string, batch bool) error {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return err
	}
	defer c.Close()
	r := bufio.NewReader(c)
	call := func(v any) (map[string]any, error) {
		raw, _ := json.Marshal(v)
		if _, err := c.Write(append(raw, '\n')); err != nil {
			return nil, err
		}
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var out map[string]any
		return out, json.Unmarshal(line, &out)
	}
	if got, err := call(map[string]any{"harness": "svc", "name": name, "cwd": "/"}); err != nil || got["status"] != "ok" {
		return fmt.Errorf("bench: register %s: %v %v", name, got, err)
	}
	var got atomic.Int64
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	go func() {
		var ack string    // the message received last, acked by the next poll
		var acks []string // with batch: the batch received last
		for {
			poll := map[string]any{"action": "poll", "waitSecs": 30}
			if ack != "" {
				poll["ack"] = ack
			}
			if batch {
				poll["max"] = 64
				if len(acks) > 0 {
					poll["acks"] = acks
				}
			}
			m, err := call(poll)
			if err == nil && ack != "" && m["messageId"] == ack {
				// A daemon older than the ack on poll ignored it: counting on would count one
				// message again and again.
				err = fmt.Errorf("bench: svc %s: the daemon ignored the ack carried by the poll", name)
				fmt.Fprintln(os.Stderr, err)
			}
			if err != nil {
				mu.Lock()
				got.Store(-1 << 40) // the connection ended: wake waiters with a failure
				cond.Broadcast()
				mu.Unlock()
				return
			}
			// An error line is the ack's: it did not take effect and goes again with the next
			// poll. A deliver or a timeout answers a poll whose ack was taken.
			n := int64(1)
			switch m["action"] {
			case "timeout":
				ack, acks = "", nil
				continue
			case "deliver":
				ack, _ = m["messageId"].(string)
			case "batch":
				msgs, _ := m["messages"].([]any)
				acks = acks[:0]
				for _, d := range msgs {
					dm, _ := d.(map[string]any)
					id, _ := dm["messageId"].(string)
					acks = append(acks, id)
				}
				n = int64(len(acks))
			default:
				continue
			}
			mu.Lock()
			got.Add(n)
			cond.Broadcast()
			mu.Unlock()
		}
	}()
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || f[0] != "wait" {
			fmt.Println("error bad command")
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		mu.Lock()
		for got.Load() >= 0 && got.Load() < n {
			cond.Wait()
		}
		ok := got.Load() >= 0
		mu.Unlock()
		if !ok {
			fmt.Println("error connection ended")
			continue
		}
		fmt.Println("reached")
	}
	return nil
}
