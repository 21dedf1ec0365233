package mcp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/mcp"
)

func TestMain(m *testing.M) { daemontest.Main(m) }

// run feeds lines to a bridge and returns every line it wrote, in order.
func run(t *testing.T, cfg mcp.Config, lines ...string) []string {
	t.Helper()
	var out bytes.Buffer
	cfg.In = strings.NewReader(strings.Join(lines, "\n") + "\n")
	cfg.Out = &out
	cfg.Version = "test"
	if cfg.AgentSock == "" {
		cfg.AgentSock = filepath.Join(t.TempDir(), "absent.sock")
		cfg.HTTPSock = cfg.AgentSock
	}
	if err := mcp.Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if out.Len() == 0 {
		got = nil
	}
	return got
}

func TestProtocol(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"initialize default version",
			[]string{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`},
			[]string{`{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"tools":{"listChanged":false}},"protocolVersion":"2025-06-18","serverInfo":{"name":"xmsg","version":"test"}}}`}},
		{"initialize older version is echoed",
			[]string{`{"jsonrpc":"2.0","id":"a","method":"initialize","params":{"protocolVersion":"2024-11-05"}}`},
			[]string{`{"jsonrpc":"2.0","id":"a","result":{"capabilities":{"tools":{"listChanged":false}},"protocolVersion":"2024-11-05","serverInfo":{"name":"xmsg","version":"test"}}}`}},
		{"initialize unknown version gets the default",
			[]string{`{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"1999-01-01"}}`},
			[]string{`{"jsonrpc":"2.0","id":2,"result":{"capabilities":{"tools":{"listChanged":false}},"protocolVersion":"2025-06-18","serverInfo":{"name":"xmsg","version":"test"}}}`}},
		{"notifications get no answer",
			[]string{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`, `{"jsonrpc":"2.0","method":"whatever"}`},
			nil},
		{"ping", []string{`{"jsonrpc":"2.0","id":7,"method":"ping"}`}, []string{`{"jsonrpc":"2.0","id":7,"result":{}}`}},
		{"unknown method", []string{`{"jsonrpc":"2.0","id":8,"method":"resources/list"}`},
			[]string{`{"jsonrpc":"2.0","id":8,"error":{"code":-32601,"message":"Method not found: resources/list"}}`}},
		{"unparseable line", []string{`{"jsonrpc":`}, []string{`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`}},
		{"invalid UTF-8", []string{"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}"}, []string{`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`}},
		{"batch", []string{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`}, []string{`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request"}}`}},
		{"bad id type", []string{`{"jsonrpc":"2.0","id":{},"method":"ping"}`}, []string{`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: bad id"}}`}},
		{"null id is answered", []string{`{"jsonrpc":"2.0","id":null,"method":"ping"}`}, []string{`{"jsonrpc":"2.0","id":null,"result":{}}`}},
		{"client responses are ignored", []string{`{"jsonrpc":"2.0","id":1,"result":{}}`, `{"jsonrpc":"2.0","id":2,"error":{"code":1,"message":"x"}}`}, nil},
		{"blank lines are ignored", []string{``, `  `, `{"jsonrpc":"2.0","id":1,"method":"ping"}`}, []string{`{"jsonrpc":"2.0","id":1,"result":{}}`}},
		{"unknown tool", []string{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"rm","arguments":{}}}`},
			[]string{`{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"Unknown tool: rm"}}`}},
		{"no HTML escaping", []string{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"<a&b>","arguments":{}}}`},
			[]string{`{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"Unknown tool: <a&b>"}}`}},
		{"param names are case-sensitive", []string{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"Name":"send","arguments":{}}}`},
			[]string{`{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"Invalid params: tools/call needs a tool name"}}`}},
		{"tools/call without name", []string{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{}}`},
			[]string{`{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"Invalid params: tools/call needs a tool name"}}`}},
		{"from is rejected", []string{`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"send","arguments":{"ref":"x","text":"y","from":"svc:root"}}}`},
			[]string{`{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"the 'from' argument is not accepted: xmsg attests the sender from this session"}],"isError":true}}`}},
		{"missing arguments", []string{`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"reply","arguments":{"text":"y"}}}`},
			[]string{`{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"text","text":"message_id and text are required"}],"isError":true}}`}},
		{"daemon not running", []string{`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"send","arguments":{"ref":"x","text":"y"}}}`},
			[]string{`{"jsonrpc":"2.0","id":6,"result":{"content":[{"type":"text","text":"xmsg is not reachable: connect: no such file or directory"}],"isError":true}}`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, mcp.Config{}, tc.in...)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func toolNames(t *testing.T, line string) []string {
	t.Helper()
	var r struct {
		Result struct {
			Tools []struct {
				Name        string         `json:"name"`
				InputSchema map[string]any `json:"inputSchema"`
			} `json:"tools"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range r.Result.Tools {
		if tl.InputSchema["type"] != "object" {
			t.Fatalf("tool %s: input schema %v is not an object schema", tl.Name, tl.InputSchema)
		}
		names = append(names, tl.Name)
	}
	return names
}

func TestToolsList(t *testing.T) {
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	// receive only below an attested Codex process, as the daemon says at the bridge's start;
	// a Claude, pi or plain bridge, or one whose daemon is unreachable, lists three tools.
	if got := toolNames(t, run(t, mcp.Config{}, list)[0]); strings.Join(got, ",") != "list,send,reply" {
		t.Fatalf("tools without a daemon: got %v, want exactly [list send reply]", got)
	}
	for harness, want := range map[string]string{"codex": "list,send,reply,receive", "claude": "list,send,reply", "pi": "list,send,reply", "": "list,send,reply"} {
		f := newFakeAgentSock(t)
		f.harness = harness
		if got := toolNames(t, run(t, mcp.Config{AgentSock: f.path}, list)[0]); strings.Join(got, ",") != want {
			t.Fatalf("tools under %q: got %v, want exactly [%s]", harness, got, want)
		}
		got := run(t, mcp.Config{AgentSock: f.path}, strings.TrimSuffix(receiveCall, "\n"))
		if unknown := strings.Contains(got[0], "Unknown tool: receive"); unknown != (harness != "codex") {
			t.Fatalf("receive under %q: %s", harness, got[0])
		}
	}
	// An agy session's messages arrive through agentapi: no receive tool for it.
	if got := toolNames(t, run(t, mcp.Config{AgyStart: true, AgentSock: filepath.Join(t.TempDir(), "none.sock")}, list)[0]); strings.Join(got, ",") != "list,send,reply" {
		t.Fatalf("agy tools: got %v, want exactly [list send reply]", got)
	}
	if got := toolNames(t, run(t, mcp.Config{ReplyOnly: true}, list)[0]); strings.Join(got, ",") != "reply" {
		t.Fatalf("reply-only tools: got %v, want [reply]", got)
	}
}

func TestReplyOnlyRefusesSendAndList(t *testing.T) {
	got := run(t, mcp.Config{ReplyOnly: true},
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send","arguments":{"ref":"x","text":"y"}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list"}}`)
	for _, line := range got {
		if !strings.Contains(line, `"isError":true`) || !strings.Contains(line, "reply-only") {
			t.Fatalf("got %s, want an isError result naming reply-only", line)
		}
	}
	if len(got) != 2 {
		t.Fatalf("got %d answers, want 2", len(got))
	}
}

func TestLineTooLong(t *testing.T) {
	got := run(t, mcp.Config{}, `{"x":"`+strings.Repeat("a", 5<<20)+`"}`, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	want := []string{`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: line too long"}}`, `{"jsonrpc":"2.0","id":1,"result":{}}`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestContextEndsRun: Run returns ctx's error when ctx ends while waiting for input.
func TestContextEndsRun(t *testing.T) {
	r, w := io.Pipe()
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := mcp.Run(ctx, mcp.Config{In: r, Out: io.Discard}); err != context.Canceled {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

type bridge struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
	id  int
}

func (b *bridge) call(method string, params any) map[string]any {
	b.t.Helper()
	b.id++
	req, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": b.id, "method": method, "params": params})
	if _, err := b.in.Write(append(req, '\n')); err != nil {
		b.t.Fatal(err)
	}
	line, err := b.out.ReadBytes('\n')
	if err != nil {
		b.t.Fatalf("read: %v", err)
	}
	var resp map[string]any
	if err := json.Unmarshal(line, &resp); err != nil {
		b.t.Fatalf("answer %q: %v", line, err)
	}
	if resp["id"] != float64(b.id) {
		b.t.Fatalf("answer %v for request %d", resp, b.id)
	}
	return resp
}

// tool calls a tool and returns its text and isError.
func (b *bridge) tool(name string, args map[string]any) (string, bool) {
	b.t.Helper()
	resp := b.call("tools/call", map[string]any{"name": name, "arguments": args})
	res, ok := resp["result"].(map[string]any)
	if !ok {
		b.t.Fatalf("tools/call %s: got %v, want a result", name, resp)
	}
	content := res["content"].([]any)[0].(map[string]any)
	return content["text"].(string), res["isError"].(bool)
}

// TestBridgeEndToEnd runs `xmsg mcp` as a child of a Claude session process, against a real
// daemon: send reaches a service attested as the session, reply answers a message the service
// sent, list reads http.sock.
func TestBridgeEndToEnd(t *testing.T) {
	const sessionID = "11111111-2222-4333-8444-555555555555"
	e := daemontest.New(t, daemontest.Options{SvcExe: map[string]string{"bot": os.Args[0]}})
	bot, reg := e.Service("", "bot")
	parent, in, out := daemontest.StartMCP(t, e, false)
	inbox := e.Claude(parent.Process.Pid, sessionID, "alice")
	b := &bridge{t: t, in: in, out: out}

	if r := b.call("initialize", map[string]any{"protocolVersion": "2025-06-18"}); r["result"] == nil {
		t.Fatalf("initialize: %v", r)
	}
	in.Write([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n"))

	text, isErr := b.tool("send", map[string]any{"ref": "svc:bot", "text": "hi bot"})
	var d map[string]any
	if isErr || json.Unmarshal([]byte(text), &d) != nil || d["messageId"] == "" {
		t.Fatalf("send: got %q (isError %v), want the delivery", text, isErr)
	}
	got := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 5})
	if got["messageId"] != d["messageId"] || got["fromName"] != "xmsg@testhost · claude:alice" || got["text"] != "hi bot" {
		t.Fatalf("service got %v, want the message from claude:alice", got)
	}
	if o := got["origin"].(map[string]any); o["kind"] != "local" || o["sessionId"] != sessionID {
		t.Fatalf("origin %v, want local %s", o, sessionID)
	}
	bot.Call(reg, map[string]any{"action": "ack", "messageId": got["messageId"]})

	// The service asks the session something; the session answers with the reply tool.
	a := bot.Dial(e.AgentPath)
	q := bot.Call(a, map[string]any{"action": "send", "ref": "alice", "text": "question"})
	qid := q["delivery"].(map[string]any)["messageId"].(string)
	inbox.Next(t)
	text, isErr = b.tool("reply", map[string]any{"message_id": qid, "text": "answer"})
	if isErr || !strings.Contains(text, `"pushOutcome":"pushed"`) {
		t.Fatalf("reply: got %q (isError %v), want pushed", text, isErr)
	}
	pushed := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 5})
	if !strings.Contains(pushed["envelope"].(string), "reply to message_id="+qid) || pushed["text"] != "answer" {
		t.Fatalf("pushed reply: got %v", pushed)
	}

	text, isErr = b.tool("list", nil)
	if isErr || !strings.Contains(text, `"sessionId":"svc:bot"`) || !strings.Contains(text, sessionID) {
		t.Fatalf("list: got %q (isError %v), want both sessions", text, isErr)
	}
	if text, isErr = b.tool("list", map[string]any{"host": "elsewhere"}); !isErr || !strings.Contains(text, "404") {
		t.Fatalf("list of an unknown peer: got %q (isError %v), want a 404 error", text, isErr)
	}
	if text, isErr = b.tool("send", map[string]any{"ref": "nobody", "text": "x"}); !isErr || text != "error not_found: no live session matches 'nobody'" {
		t.Fatalf("send to nobody: got %q (isError %v)", text, isErr)
	}
	if _, isErr = b.tool("send", map[string]any{"ref": "svc:bot", "text": "x", "from": "svc:root"}); !isErr {
		t.Fatalf("send with from: want isError")
	}
}

// TestBridgeNotASession: a bridge whose ancestors include no session is refused by the daemon.
func TestBridgeNotASession(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{})
	parent, in, out := daemontest.StartMCP(t, e, false)
	b := &bridge{t: t, in: in, out: out}
	text, isErr := b.tool("send", map[string]any{"ref": "x", "text": "y"})
	if !isErr || !strings.HasPrefix(text, "error not_recipient: peer PID ") {
		t.Fatalf("got %q (isError %v), want not_recipient", text, isErr)
	}
	_ = parent
}
