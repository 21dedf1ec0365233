package mcp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/xmsg/xmsg/internal/mcp"
)

// fakeAgentSock is a real agent.sock listener that answers peek with two messages, the
// harness frame with harness, and records every frame it reads, with how much the bridge had
// written to its client by then.
type fakeAgentSock struct {
	path    string
	harness string
	mu      sync.Mutex
	frames  []map[string]any
	outAt   []int
	out     interface{ Len() int }
}

func newFakeAgentSock(t *testing.T) *fakeAgentSock {
	f := &fakeAgentSock{path: filepath.Join(t.TempDir(), "agent.sock"), harness: "codex"}
	l, err := net.Listen("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f
}

func (f *fakeAgentSock) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var fr map[string]any
		json.Unmarshal(line, &fr)
		f.mu.Lock()
		f.frames = append(f.frames, fr)
		n := 0
		if f.out != nil {
			n = f.out.Len()
		}
		f.outAt = append(f.outAt, n)
		f.mu.Unlock()
		switch fr["action"] {
		case "harness":
			c.Write([]byte(`{"status":"ok","harness":"` + f.harness + `"}` + "\n"))
		case "peek":
			c.Write([]byte(`{"status":"ok","messages":[{"action":"deliver","messageId":"m1","envelope":"E1"},{"action":"deliver","messageId":"m2","envelope":"E2"}],"waiting":0}` + "\n"))
		default:
			c.Write([]byte(`{"status":"ok"}` + "\n"))
		}
	}
}

func (f *fakeAgentSock) acks() (ids []string, outAt []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, fr := range f.frames {
		if fr["action"] == "ack" {
			ids = append(ids, fr["messageId"].(string))
			outAt = append(outAt, f.outAt[i])
		}
	}
	return ids, outAt
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("client gone") }
func (failWriter) Len() int                  { return 0 }

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) Len() int { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Len() }

const receiveCall = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"receive","arguments":{},"_meta":{"threadId":"t"}}}` + "\n"

// TestReceiveAcksOnlyWritten: receive acknowledges what it returned only once its result is
// written to the client; a result that could not be written (the client gone) acks nothing,
// so those messages come again. The thread's _meta goes with every frame.
func TestReceiveAcksOnlyWritten(t *testing.T) {
	f := newFakeAgentSock(t)
	var out lockedBuffer
	f.out = &out
	if err := mcp.Run(context.Background(), mcp.Config{AgentSock: f.path, In: strings.NewReader(receiveCall), Out: &out}); err != nil {
		t.Fatal(err)
	}
	ids, at := f.acks()
	if strings.Join(ids, ",") != "m1,m2" {
		t.Fatalf("acks %v, want m1,m2", ids)
	}
	for i, n := range at {
		if n == 0 {
			t.Fatalf("ack %s sent before the result was written", ids[i])
		}
	}
	for _, fr := range f.frames[1:] { // the first asks for the harness, at start
		if m, _ := fr["_meta"].(map[string]any); m["threadId"] != "t" {
			t.Fatalf("frame %v without the thread's _meta", fr)
		}
	}
	if !strings.Contains(out.b.String(), `message_id=m1\nE1\n\nmessage_id=m2\nE2`) {
		t.Fatalf("result %s", out.b.String())
	}

	g := newFakeAgentSock(t)
	if err := mcp.Run(context.Background(), mcp.Config{AgentSock: g.path, In: strings.NewReader(receiveCall), Out: failWriter{}}); err != nil {
		t.Fatal(err)
	}
	if ids, _ := g.acks(); len(ids) != 0 {
		t.Fatalf("a result that was never written acked %v", ids)
	}
}
