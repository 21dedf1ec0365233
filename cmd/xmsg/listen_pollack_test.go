//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenAcksAsTheDaemonSays: xmsg listen carries each ack on its next poll only where the
// registration's answer announced it (pollAck), and otherwise, as with a daemon older than
// the extension, sends ack frames; the last message of --count is acked with a frame either
// way (no poll follows it); an ack the daemon could not store is said, and the message comes
// again. The bus here is a scripted register.sock. Mutants tried: the announcement ignored
// (red: ack frames where the daemon takes them on the poll); the poll's ack sent to a daemon
// that did not announce it (red: an old daemon would deliver again).
func TestListenAcksAsTheDaemonSays(t *testing.T) {
	deliver := func(id string) string {
		return `{"action":"deliver","messageId":"` + id + `","fromName":"x","text":"hi"}`
	}
	ok := `{"status":"ok"}`
	type step struct{ frame, reply string }
	for _, c := range []struct {
		name     string
		announce bool
		count    string
		script   []step
		printed  string
		warns    bool
	}{
		{"announced", true, "2", []step{{"poll", deliver("m1")}, {"poll+ack:m1", deliver("m2")}, {"ack:m2", ok}}, "m1 m2", false},
		{"not announced", false, "2", []step{{"poll", deliver("m1")}, {"ack:m1", ok}, {"poll", deliver("m2")}, {"ack:m2", ok}}, "m1 m2", false},
		{"ack not stored", true, "3", []step{{"poll", deliver("m1")}, {"poll+ack:m1", `{"status":"error","error":"internal","detail":"ack failed"}`},
			{"poll", deliver("m1")}, {"poll+ack:m1", deliver("m2")}, {"ack:m2", ok}}, "m1 m1 m2", true},
	} {
		dir, err := os.MkdirTemp("", "xl")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		sock := filepath.Join(dir, "register.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		frames := make(chan []string, 1)
		go func() {
			var got []string
			defer func() { frames <- got }()
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			if _, err := r.ReadBytes('\n'); err != nil { // the registration
				return
			}
			answer := `{"status":"ok","sessionId":"cli:one"}`
			if c.announce {
				answer = `{"status":"ok","sessionId":"cli:one","pollAck":true}`
			}
			io.WriteString(conn, answer+"\n")
			for i := 0; ; i++ {
				line, err := r.ReadBytes('\n')
				if err != nil {
					return
				}
				var f map[string]any
				json.Unmarshal(line, &f)
				got = append(got, frameOf(f))
				if i >= len(c.script) || got[i] != c.script[i].frame {
					return // off the script: the comparison below says how
				}
				io.WriteString(conn, c.script[i].reply+"\n")
			}
		}()
		var out, errOut strings.Builder
		err = run([]string{"listen", "one", "--register-sock", sock, "--agent-sock", filepath.Join(dir, "agent.sock"), "--count", c.count, "--json"}, strings.NewReader(""), &out, &errOut)
		ln.Close()
		if err != nil {
			t.Errorf("%s: listen: %v", c.name, err) // the frames below say where it left the script
		}
		var want []string
		for _, s := range c.script {
			want = append(want, s.frame)
		}
		if got := strings.Join(<-frames, " "); got != strings.Join(want, " ") {
			t.Errorf("%s: frames %q, want %q", c.name, got, strings.Join(want, " "))
		}
		var printed []string
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var m struct{ MessageID string }
			json.Unmarshal([]byte(line), &m)
			printed = append(printed, m.MessageID)
		}
		if strings.Join(printed, " ") != c.printed {
			t.Errorf("%s: printed %q, want %q", c.name, printed, c.printed)
		}
		if warned := strings.Contains(errOut.String(), "did not take the ack of m1"); warned != c.warns {
			t.Errorf("%s: stderr %q, want a warning: %v", c.name, errOut.String(), c.warns)
		}
	}
}

// frameOf names a frame: its action, with the message it acks.
func frameOf(f map[string]any) string {
	switch {
	case f["action"] == "ack":
		return "ack:" + f["messageId"].(string)
	case f["action"] == "poll" && f["ack"] != nil:
		return "poll+ack:" + f["ack"].(string)
	}
	return f["action"].(string)
}
