package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
)

// worker is a service process: it registers as svc:$NAME on $REGISTER_SOCK, takes every
// queued message (acking each unless $NO_ACK is set), prints each text on a line, and exits
// when the queue is empty.
func worker() {
	fail := func(err error) { fmt.Fprintln(os.Stderr, "worker:", err); os.Exit(1) }
	c, err := net.Dial("unix", os.Getenv("REGISTER_SOCK"))
	if err != nil {
		fail(err)
	}
	r := bufio.NewReader(c)
	call := func(v any) map[string]any {
		raw, _ := json.Marshal(v)
		c.Write(append(raw, '\n'))
		line, err := r.ReadBytes('\n')
		if err != nil {
			fail(err)
		}
		var out map[string]any
		json.Unmarshal(line, &out)
		return out
	}
	if got := call(map[string]any{"harness": "svc", "name": os.Getenv("NAME")}); got["status"] != "ok" {
		fail(fmt.Errorf("register: %v", got))
	}
	max, _ := strconv.Atoi(os.Getenv("MAX")) // messages to take; 0 = all
	for n := 1; ; n++ {
		got := call(map[string]any{"action": "poll", "waitSecs": 0})
		if got["action"] == "timeout" {
			return
		}
		if got["action"] != "deliver" {
			fail(fmt.Errorf("poll: %v", got))
		}
		fmt.Println(got["text"])
		if os.Getenv("NO_ACK") != "" {
			return
		}
		if ack := call(map[string]any{"action": "ack", "messageId": got["messageId"]}); ack["status"] != "ok" {
			fail(fmt.Errorf("ack: %v", ack))
		}
		if n == max {
			return
		}
	}
}
