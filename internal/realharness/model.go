// Package realharness is test support for running the real agent harnesses (Claude Code,
// Codex, pi) against xmsg: installing them from the npm registry into a cache, a fake model
// API that speaks enough of the Anthropic Messages API and the OpenAI Responses API (both
// streaming) to script tool calls, a network namespace with nothing but loopback to run them
// in, and a pseudo-terminal for their interactive interfaces. Imported by tests only.
package realharness

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
)

// Turn is what the model is asked for, reduced to what a script decides on.
type Turn struct {
	API   string   // "anthropic" or "responses"
	Tools []string // the tool names offered
	// Last is the text of the newest input item: a user turn's text, or a tool result's.
	Last       string
	ToolResult bool // the newest item is a tool result
	System     string
	Raw        []byte // the whole request body
}

// Tool returns the offered tool whose name ends in "xmsg" + sep + name for some separator
// ("mcp__xmsg__reply", "xmsg__reply", "xmsg_reply"), or "".
func (t Turn) Tool(name string) string {
	for _, n := range t.Tools {
		if strings.HasSuffix(n, "__"+name) && strings.Contains(n, "xmsg") {
			return n
		}
	}
	for _, n := range t.Tools {
		if strings.HasSuffix(n, "_"+name) && strings.Contains(n, "xmsg") {
			return n
		}
	}
	return ""
}

// Answer is the model's answer: text, or one tool call.
type Answer struct {
	Text string
	Call string         // tool name; "" for text
	Args map[string]any // the call's input
}

// Script decides the answer to a turn.
type Script func(Turn) Answer

// Model is a fake model API on an http.Server; every request body is written to Dir.
type Model struct {
	Dir    string
	Script Script
	n      atomic.Int64
	mu     sync.Mutex
}

func (m *Model) save(kind string, body []byte) {
	if m.Dir == "" {
		return
	}
	n := m.n.Add(1)
	os.WriteFile(filepath.Join(m.Dir, fmt.Sprintf("%04d-%s.json", n, kind)), body, 0o600)
}

// ServeHTTP answers POST /v1/messages (Anthropic), POST /v1/responses and
// /v1/chat/completions-less Responses only; count_tokens gets a constant; anything else 404.
func (m *Model) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case r.Method == "POST" && strings.HasSuffix(path, "/messages/count_tokens"):
		m.save("count_tokens", body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"input_tokens":12}`)
	case r.Method == "POST" && strings.HasSuffix(path, "/messages"):
		m.save("anthropic", body)
		m.anthropic(w, body)
	case r.Method == "POST" && strings.HasSuffix(path, "/responses"):
		m.save("responses", body)
		m.responses(w, body)
	case r.Method == "GET" && strings.HasSuffix(path, "/models"):
		m.save("models", []byte(r.URL.String()))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[],"models":[]}`)
	default:
		m.save("other", []byte(r.Method+" "+r.URL.String()+"\n"+string(body)))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":{"type":"not_found_error","message":"not here"}}`)
	}
}

func (m *Model) answer(t Turn) Answer {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Script == nil {
		return Answer{Text: "ok"}
	}
	return m.Script(t)
}

// textOf flattens an Anthropic or Responses content value (a string, or a list of blocks).
func textOf(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []map[string]json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return ""
	}
	var out []string
	for _, b := range blocks {
		for _, k := range []string{"text", "content", "output"} {
			if v, ok := b[k]; ok {
				out = append(out, textOf(v))
			}
		}
	}
	return strings.Join(out, "\n")
}

func (m *Model) anthropic(w http.ResponseWriter, body []byte) {
	var req struct {
		Stream   bool            `json:"stream"`
		System   json.RawMessage `json:"system"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	json.Unmarshal(body, &req)
	t := Turn{API: "anthropic", Raw: body, System: textOf(req.System)}
	for _, tl := range req.Tools {
		t.Tools = append(t.Tools, tl.Name)
	}
	// The newest user turn (a trailing system message may follow it).
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if last := req.Messages[i]; last.Role == "user" {
			t.Last = textOf(last.Content)
			t.ToolResult = strings.Contains(string(last.Content), `"tool_result"`)
			break
		}
	}
	a := m.answer(t)
	id := fmt.Sprintf("msg_%d", m.n.Load())
	block, stop := map[string]any{"type": "text", "text": ""}, "end_turn"
	if a.Call != "" {
		block, stop = map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d", m.n.Load()), "name": a.Call, "input": map[string]any{}}, "tool_use"
	}
	usage := map[string]any{"input_tokens": 12, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	if !req.Stream {
		content := []any{map[string]any{"type": "text", "text": a.Text}}
		if a.Call != "" {
			block["input"] = a.Args
			content = []any{block}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
			"content": content, "stop_reason": stop, "stop_sequence": nil, "usage": usage})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	ev := func(name string, v any) {
		data, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	ev("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": id, "type": "message", "role": "assistant",
		"model": "claude-sonnet-4-5", "content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": usage}})
	ev("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": block})
	if a.Call != "" {
		args, _ := json.Marshal(a.Args)
		ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(args)}})
	} else {
		ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": a.Text}})
	}
	ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	ev("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 3}})
	ev("message_stop", map[string]any{"type": "message_stop"})
}

func (m *Model) responses(w http.ResponseWriter, body []byte) {
	var req struct {
		Instructions string            `json:"instructions"`
		Input        []json.RawMessage `json:"input"`
		Tools        []struct {
			Type  string `json:"type"`
			Name  string `json:"name"`
			Tools []struct {
				Name string `json:"name"`
			} `json:"tools"`
		} `json:"tools"`
	}
	json.Unmarshal(body, &req)
	t := Turn{API: "responses", Raw: body, System: req.Instructions}
	// A namespace's tools (Codex puts each MCP server's in one) are named namespace__tool
	// here, and called with the namespace and the tool's own name.
	namespaced := map[string][2]string{}
	for _, tl := range req.Tools {
		if tl.Type == "namespace" {
			for _, sub := range tl.Tools {
				full := tl.Name + "__" + sub.Name
				namespaced[full] = [2]string{tl.Name, sub.Name}
				t.Tools = append(t.Tools, full)
			}
			continue
		}
		t.Tools = append(t.Tools, tl.Name)
	}
	if n := len(req.Input); n > 0 {
		var last struct {
			Type    string          `json:"type"`
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
			Output  json.RawMessage `json:"output"`
		}
		json.Unmarshal(req.Input[n-1], &last)
		if last.Type == "function_call_output" || last.Type == "custom_tool_call_output" || last.Type == "mcp_tool_call_output" {
			t.ToolResult, t.Last = true, textOf(last.Output)
		} else {
			t.Last = textOf(last.Content)
		}
	}
	a := m.answer(t)
	n := m.n.Load()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	ev := func(v map[string]any) {
		data, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", v["type"], data)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	rid := fmt.Sprintf("resp_%d", n)
	ev(map[string]any{"type": "response.created", "response": map[string]any{"id": rid}})
	if a.Call != "" {
		args, _ := json.Marshal(a.Args)
		item := map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%d", n), "call_id": fmt.Sprintf("call_%d", n), "name": a.Call, "arguments": string(args)}
		if ns, ok := namespaced[a.Call]; ok {
			item["namespace"], item["name"] = ns[0], ns[1]
		}
		ev(map[string]any{"type": "response.output_item.done", "output_index": 0, "item": item})
	} else {
		ev(map[string]any{"type": "response.output_item.done", "output_index": 0, "item": map[string]any{"type": "message", "role": "assistant",
			"id": fmt.Sprintf("msg_%d", n), "content": []any{map[string]any{"type": "output_text", "text": a.Text, "annotations": []any{}}}}})
	}
	ev(map[string]any{"type": "response.completed", "response": map[string]any{"id": rid, "usage": map[string]any{
		"input_tokens": 12, "input_tokens_details": nil, "output_tokens": 3, "output_tokens_details": nil, "total_tokens": 15}}})
}
