//go:build linux

package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/codex"
	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/fed/fedtest"
)

// TestCodexReceive: a Codex thread reads its mail through the MCP bridge's receive tool
// (docs/protocol.md §2.8). A fake Codex (a trusted copied executable holding the thread's
// writer lock and rollout) starts `xmsg mcp` as its child and speaks MCP over stdio with
// _meta. Messages sent to codex:<thread> over http.sock, agent.sock, from a service and over
// federation (a pinned mTLS peer on loopback) reach
// it in order, each behind the preamble with its message id; what was returned is acked once
// the result is written, so the next receive does not return it again (a result that could not
// be written acks nothing: TestReceiveAcksOnlyWritten in internal/mcp). Other tools carry a one-line
// notice while mail waits. A call without _meta, and a bridge below another thread, get none
// of this thread's mail.
func TestCodexReceive(t *testing.T) {
	base := shortTemp(t)
	home := newCodexHome(t, base)
	exe := daemontest.CopyExe(t, base, "codex")
	botExe := daemontest.CopyExe(t, base, "bot")
	// A federation peer "a" on loopback, as in TestConformance.
	self := fedtest.New(t, "testhost", nil, fedtest.Options{})
	peer := fedtest.New(t, "a", nil, fedtest.Options{})
	fedAddr := freePort(t)
	for name, data := range map[string][]byte{"cert.pem": self.CertPEM, "key.pem": self.KeyPEM,
		"peers.json": peersJSON(map[string]map[string]any{"a": {"address": freePort(t), "pin": peer.Pin, "allow": []string{"send"}}})} {
		if err := os.WriteFile(filepath.Join(base, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d := newDaemon(t, "--codex-exe", exe, "--codex-home", home.dir, "--svc-exe", "bot="+botExe, "--fed-listen", fedAddr,
		"--fed-cert", filepath.Join(base, "cert.pem"), "--fed-key", filepath.Join(base, "key.pem"), "--peers-file", filepath.Join(base, "peers.json"))
	pair, err := tls.X509KeyPair(peer.CertPEM, peer.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	fedPeer := &http.Client{Timeout: daemontest.Wait, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}}
	thread := uuid.NewString()
	meta := map[string]any{"threadId": thread, "sessionId": thread, "turn_id": "turn-1"}
	lockEnv := []string{daemontest.LockEnv + "=" + home.lock(thread), daemontest.OpenEnv + "=" + home.rollout(thread, thread)}
	bridge, in, out := daemontest.StartMCPAt(t, exe, d.sock("agent"), d.sock("http"), lockEnv...)
	id := 0
	rpc := func(params map[string]any) map[string]any {
		t.Helper()
		id++
		req, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
		if _, err := in.Write(append(req, '\n')); err != nil {
			t.Fatal(err)
		}
		return readResult(t, out)
	}
	texts := func(r map[string]any) []string {
		t.Helper()
		var got []string
		for _, c := range r["content"].([]any) {
			got = append(got, c.(map[string]any)["text"].(string))
		}
		return got
	}
	receive := func() (ids []string, all string) {
		t.Helper()
		r := rpc(map[string]any{"name": "receive", "arguments": map[string]any{}, "_meta": meta})
		if r["isError"] != false {
			t.Fatalf("receive: %v", r)
		}
		tx := texts(r)
		for _, block := range strings.Split(tx[0], "\n\n"+"message_id=") {
			block = strings.TrimPrefix(block, "message_id=")
			if i := strings.IndexByte(block, '\n'); i > 0 && strings.HasPrefix(block[i+1:], codex.Preamble) {
				ids = append(ids, block[:i])
			} else if block != "No messages wait for this thread." {
				t.Fatalf("receive block %q: want message_id=<id> then the preamble", block)
			}
		}
		return ids, strings.Join(tx, "\n")
	}

	// Nothing yet.
	if ids, _ := receive(); len(ids) != 0 {
		t.Fatalf("empty queue: got %v", ids)
	}
	// Mail by three ways in: http.sock (anonymous), agent.sock (a pi session's send) and a
	// registered service.
	var sent []string
	status, v := d.do("POST", "/v1/sessions/codex:"+thread+"/messages", `{"from":"cli","text":"one via http"}`)
	if status != 202 {
		t.Fatalf("http send: %d %v", status, v)
	}
	sent = append(sent, field(v, "messageId").(string))
	pi := daemontest.Start(t, "")
	pc := pi.Dial(d.sock("register"))
	if r := pi.Call(pc, map[string]any{"harness": "pi", "sessionName": "peer"}); r["status"] != "ok" {
		t.Fatalf("pi register: %v", r)
	}
	pa := pi.Dial(d.sock("agent"))
	r := pi.Call(pa, map[string]any{"action": "send", "ref": "codex:" + thread, "text": "two via agent.sock"})
	if r["status"] != "ok" {
		t.Fatalf("agent.sock send: %v", r)
	}
	sent = append(sent, field(r["delivery"], "messageId").(string))
	bot := daemontest.Start(t, botExe)
	if r := bot.Call(bot.Dial(d.sock("register")), map[string]any{"harness": "svc", "name": "bot"}); r["status"] != "ok" {
		t.Fatalf("svc register: %v", r)
	}
	r = bot.Call(bot.Dial(d.sock("agent")), map[string]any{"action": "send", "ref": "codex:" + thread, "text": "three from svc"})
	if r["status"] != "ok" {
		t.Fatalf("svc send: %v", r)
	}
	sent = append(sent, field(r["delivery"], "messageId").(string))
	fedID := uuid.Must(uuid.NewV7()).String()
	env, _ := json.Marshal(map[string]any{"v": 2, "id": fedID, "to": map[string]any{"ref": "codex:" + thread}, "body": "four over federation",
		"push_replies": true, "thread_id": fedID, "created_at": time.Now().Unix(),
		"principal": map[string]any{"kind": "session", "harness": "claude", "session_id": "s-1", "name": "alice"}})
	resp, err := fedPeer.Post("https://"+fedAddr+"/fed/v2/messages", "application/json", bytes.NewReader(env))
	if err != nil {
		t.Fatalf("fed post: %v", err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 202 {
		t.Fatalf("fed send: %d %s", resp.StatusCode, raw)
	}
	sent = append(sent, fedID)

	// Another tool's result says that four wait, on a line of its own after the result.
	r = rpc(map[string]any{"name": "list", "arguments": map[string]any{}, "_meta": meta})
	if tx := texts(r); r["isError"] != false || len(tx) != 2 || tx[1] != "[xmsg] 4 messages wait for this thread: call the receive tool." {
		t.Fatalf("list with mail waiting: %v", r)
	}
	// Without _meta: refused, nothing handed over; no notice either (no thread named).
	r = rpc(map[string]any{"name": "receive", "arguments": map[string]any{"threadId": thread}})
	if r["isError"] != true || strings.Contains(fmt.Sprint(r), "one via http") {
		t.Fatalf("receive without _meta: %v", r)
	}
	// A bridge below a Codex process of another thread cannot read this one's mail.
	other := uuid.NewString()
	_, oin, oout := daemontest.StartMCPAt(t, exe, d.sock("agent"), d.sock("http"),
		daemontest.LockEnv+"="+home.lock(other), daemontest.OpenEnv+"="+home.rollout(other, other))
	req, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "receive", "arguments": map[string]any{}, "_meta": meta}})
	oin.Write(append(req, '\n'))
	if or := readResult(t, oout); or["isError"] != true || !strings.Contains(fmt.Sprint(or), "unattested") {
		t.Fatalf("receive of another thread's mail: %v", or)
	}

	// The thread receives all four, in order, behind the preamble.
	ids, all := receive()
	if strings.Join(ids, ",") != strings.Join(sent, ",") {
		t.Fatalf("received %v, want %v in order", ids, sent)
	}
	for _, want := range []string{"one via http", "two via agent.sock", "three from svc", "four over federation", "· svc:bot", "· pi:peer"} {
		if !strings.Contains(all, want) {
			t.Fatalf("received %q, missing %q", all, want)
		}
	}
	// Acked once written: not again, exactly once. (The acks follow the result line, so a call
	// made at once may still see them waiting: the list notice says when they are done.)
	daemontest.WaitFor(t, "the acks of the first receive", func() bool {
		return len(texts(rpc(map[string]any{"name": "list", "arguments": map[string]any{}, "_meta": meta}))) == 1
	})
	if ids, _ := receive(); len(ids) != 0 {
		t.Fatalf("after the ack: got %v again", ids)
	}

	// A new bridge of the same thread (Codex restarted it) reads what came since.
	status, v = d.do("POST", "/v1/sessions/codex:"+thread+"/messages", `{"from":"cli","text":"five"}`)
	if status != 202 {
		t.Fatalf("http send: %d %v", status, v)
	}
	five := field(v, "messageId").(string)
	in.Close()
	bridge.Wait()
	_, in, out = daemontest.StartMCPAt(t, exe, d.sock("agent"), d.sock("http"), lockEnv...)
	id = 0
	if ids, _ := receive(); len(ids) != 1 || ids[0] != five {
		t.Fatalf("after a new bridge: got %v, want %s", ids, five)
	}
}
