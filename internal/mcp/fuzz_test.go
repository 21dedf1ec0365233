package mcp

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
)

// FuzzRequest: any line gets at most one answer, every answer is valid JSON-RPC 2.0 with an
// id that is null or the request's own, and unparseable lines get -32700.
func FuzzRequest(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05"}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":"x","method":"ping"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"send","arguments":{"ref":"a","text":"b","from":"c"}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"reply","arguments":{"message_id":1}}}`,
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"list","arguments":[]}}`,
		`{"jsonrpc":"2.0","id":{},"method":"ping"}`, `{"id":1}`, `{"result":1}`, `[]`, `{`, `null`,
	} {
		f.Add([]byte(s))
	}
	absent := filepath.Join(f.TempDir(), "absent.sock")
	// Log as Run would set it: a valid send/reply reaches the dial of the absent agent.sock,
	// whose failure is logged.
	b := &bridge{cfg: Config{AgentSock: absent, HTTPSock: absent, Version: "fuzz", Log: slog.New(slog.DiscardHandler)}}
	b.http = nil
	f.Fuzz(func(t *testing.T, line []byte) {
		req, resp := parse(line)
		if resp == nil {
			if req.method == "tools/call" && req.id != nil {
				// Tool calls dial sockets; the argument handling before that is what is fuzzed.
				var p struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				}
				if json.Unmarshal(orEmpty(req.params), &p) != nil || p.Name == "list" {
					return
				}
			}
			resp = b.handle(context.Background(), req)
			if resp == nil {
				if req.id != nil {
					t.Fatalf("request %q with an id got no answer", line)
				}
				return
			}
			if string(resp.ID) != string(req.id) {
				t.Fatalf("answer id %s, request id %s", resp.ID, req.id)
			}
		} else if !json.Valid(line) && (resp.Error == nil || resp.Error.Code != codeParse) {
			t.Fatalf("unparseable %q: got %+v, want -32700", line, resp)
		}
		out, err := json.Marshal(resp)
		if err != nil {
			t.Fatalf("answer does not encode: %v", err)
		}
		var back map[string]json.RawMessage
		if json.Unmarshal(out, &back) != nil || string(back["jsonrpc"]) != `"2.0"` {
			t.Fatalf("answer %s is not JSON-RPC 2.0", out)
		}
		_, hasResult := back["result"]
		_, hasError := back["error"]
		if hasResult == hasError {
			t.Fatalf("answer %s must have exactly one of result and error", out)
		}
	})
}
