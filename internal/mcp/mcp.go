// Package mcp is `xmsg mcp`: a Model Context Protocol server on stdin/stdout that gives an agent
// session the xmsg tools list, send, reply and, for a Codex thread, receive (docs/protocol.md
// §2.8).
//
// The bridge holds no identity of its own. send and reply go to agent.sock, where the daemon
// attests the caller from this process's pid by walking its ancestors up to the agent session
// that started it; list reads GET /v1/sessions over http.sock. A `from` argument is refused
// rather than ignored, so an agent is told plainly that it cannot choose its sender name.
//
// Wire format: JSON-RPC 2.0, one JSON object per line. Requests are answered in arrival order
// except tool calls, which run concurrently (a slow delivery does not hold up a ping).
package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/version"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/xmsg/xmsg/internal/jsonline"
)

// Protocol versions this server speaks; the first is the default.
var versions = []string{"2025-06-18", "2024-11-05"}

const (
	// maxLine bounds one request line. A send carries at most max_body (64 KiB) of text, at
	// most 6 bytes per byte once JSON-escaped, plus the envelope.
	maxLine = 4 << 20
	// maxResponse bounds one agent.sock answer line (a reply echoes its text).
	maxResponse = 4 << 20
	// callTimeout bounds one tool call: a send may wait up to 5 s for a Claude inbox.
	callTimeout = 30 * time.Second
	// maxConcurrent tool calls in flight.
	maxConcurrent = 8
)

// JSON-RPC error codes.
const (
	codeParse          = -32700
	codeInvalidRequest = -32600
	codeMethodNotFound = -32601
	codeInvalidParams  = -32602
)

// Config of the bridge.
type Config struct {
	AgentSock string // the daemon's agent.sock (send, reply)
	HTTPSock  string // the daemon's http.sock (list)
	ReplyOnly bool   // offer only the reply tool
	In        io.Reader
	Out       io.Writer
	Log       *slog.Logger
	Version   string // serverInfo.version; "" = the build's (internal/version)
	// AgyStart: the bridge runs under an Antigravity session. It keeps an agent.sock
	// connection that announced itself with mcp_start, so the daemon attests the session
	// before any credentials exist, and reconnects with backoff (a daemon restart, the idle
	// timeout).
	AgyStart bool
}

type bridge struct {
	cfg  Config
	outM sync.Mutex
	http *http.Client
	// codex: the bridge runs below an attested Codex process, whose threads read their
	// mail with the receive tool; decided once at start from the bridge's ancestry, never
	// from a request's _meta.
	codex bool
}

// Run serves requests from cfg.In until it reaches EOF (then nil, after in-flight calls have
// answered) or ctx ends (then ctx's error).
func Run(ctx context.Context, cfg Config) error {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = version.String()
	}
	b := &bridge{cfg: cfg}
	b.http = &http.Client{
		Timeout: callTimeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", cfg.HTTPSock)
			},
			DisableKeepAlives: true,
		},
	}
	if !cfg.ReplyOnly && !cfg.AgyStart {
		b.codex = b.underCodex(ctx)
	}
	type item struct {
		line []byte
		err  error
	}
	lines := make(chan item)
	go func() {
		r := bufio.NewReaderSize(cfg.In, 64<<10)
		for {
			line, err := jsonline.ReadLine(r, maxLine)
			if errors.Is(err, jsonline.ErrTooLong) {
				// Skip the rest of that line, so that the next request is read in step.
				jsonline.SkipLine(r)
			}
			select {
			case lines <- item{line, err}:
			case <-ctx.Done():
				return
			}
			if err != nil && !errors.Is(err, jsonline.ErrTooLong) {
				return
			}
		}
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	if cfg.AgyStart {
		presence, stop := context.WithCancel(ctx)
		defer stop()
		wg.Add(1)
		go func() { defer wg.Done(); b.agyPresence(presence) }() // stop runs before wg.Wait
	}
	sem := make(chan struct{}, maxConcurrent)
	for {
		var it item
		select {
		case it = <-lines:
		case <-ctx.Done():
			return ctx.Err()
		}
		switch {
		case errors.Is(it.err, jsonline.ErrTooLong):
			b.write(errorResponse(nil, codeParse, "Parse error: line too long"))
			continue
		case it.err != nil && len(it.line) == 0:
			if errors.Is(it.err, io.EOF) {
				return nil
			}
			return fmt.Errorf("mcp: read: %w", it.err)
		}
		if len(bytes.TrimSpace(it.line)) > 0 {
			req, resp := parse(it.line)
			switch {
			case resp != nil:
				b.write(resp)
			case req.method == "tools/call" && req.id != nil:
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-sem; wg.Done() }()
					b.writeCall(ctx, b.handle(ctx, req))
				}()
			default:
				if out := b.handle(ctx, req); out != nil {
					b.write(out)
				}
			}
		}
		if it.err != nil { // a last line without newline, then EOF
			return nil
		}
	}
}

// write sends one response line and reports whether it was written whole.
func (b *bridge) write(v any) bool {
	line, err := jsonline.Encode(v)
	if err != nil {
		b.cfg.Log.Error("mcp: encode failed", "err", err)
		return false
	}
	b.outM.Lock()
	defer b.outM.Unlock()
	if _, err := b.cfg.Out.Write(line); err != nil {
		b.cfg.Log.Debug("mcp: write failed", "err", err)
		return false
	}
	return true
}

// writeCall sends a tool call's response, then runs what the result defers until it is out
// (receive's acks): only a result that reached the client may be acknowledged.
func (b *bridge) writeCall(ctx context.Context, resp *response) {
	written := b.write(resp)
	if tr, ok := resp.Result.(toolResult); ok && tr.afterWrite != nil && written {
		tr.afterWrite(ctx)
	}
}

// request is a parsed JSON-RPC request or notification. id is nil for a notification and the
// raw JSON value (a string, a number or null) otherwise.
type request struct {
	id     json.RawMessage
	method string
	params json.RawMessage
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

var null = json.RawMessage("null")

func errorResponse(id json.RawMessage, code int, msg string) *response {
	if id == nil {
		id = null
	}
	return &response{JSONRPC: "2.0", ID: id, Error: &rpcError{Code: code, Message: msg}}
}

func result(id json.RawMessage, v any) *response {
	return &response{JSONRPC: "2.0", ID: id, Result: v}
}

// parse decodes one line. Exactly one of the results is set: a request to handle, a response
// to send at once (an error), or neither (a message that needs no answer, such as a client's
// response to us).
func parse(line []byte) (request, *response) {
	obj, err := jsonline.Decode(line)
	if err != nil {
		var se *jsonline.SyntaxError
		if errors.As(err, &se) && se.NotObject {
			// Valid JSON that is not an object: a batch array or a scalar. Batches are not
			// part of the MCP versions spoken here.
			return request{}, errorResponse(nil, codeInvalidRequest, "Invalid Request")
		}
		return request{}, errorResponse(nil, codeParse, "Parse error")
	}
	id, hasID := obj["id"]
	if hasID && !validID(id) {
		return request{}, errorResponse(nil, codeInvalidRequest, "Invalid Request: bad id")
	}
	raw, ok := obj["method"]
	if !ok {
		if _, isResult := obj["result"]; isResult {
			return request{}, nil
		}
		if _, isError := obj["error"]; isError {
			return request{}, nil
		}
		if !hasID {
			return request{}, nil
		}
		return request{}, errorResponse(id, codeInvalidRequest, "Invalid Request: no method")
	}
	var method string
	if err := json.Unmarshal(raw, &method); err != nil {
		if !hasID {
			return request{}, nil
		}
		return request{}, errorResponse(id, codeInvalidRequest, "Invalid Request: method must be a string")
	}
	req := request{method: method, params: obj["params"]}
	if hasID {
		req.id = id
	}
	return req, nil
}

func validID(raw json.RawMessage) bool {
	if string(raw) == "null" {
		return true
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	switch v.(type) {
	case string, float64:
		return true
	}
	return false
}

// handle answers one request; nil for a notification.
func (b *bridge) handle(ctx context.Context, req request) *response {
	if req.id == nil {
		// Notifications (notifications/initialized, notifications/cancelled, ...) get no
		// answer, known or not (JSON-RPC 2.0 §4.1).
		return nil
	}
	switch req.method {
	case "initialize":
		return result(req.id, b.initialize(req.params))
	case "ping":
		return result(req.id, struct{}{})
	case "tools/list":
		return result(req.id, map[string]any{"tools": b.tools()})
	case "tools/call":
		params, err := jsonline.Decode(orEmpty(req.params))
		var name string
		if err == nil {
			name, err = params.String("name")
		}
		if err != nil || name == "" {
			return errorResponse(req.id, codeInvalidParams, "Invalid params: tools/call needs a tool name")
		}
		args := jsonline.Object{}
		if raw, _, ok := params.Raw("arguments"); ok {
			if args, err = jsonline.Decode(raw); err != nil {
				return errorResponse(req.id, codeInvalidParams, "Invalid params: arguments must be an object")
			}
		}
		known := false
		for _, t := range b.tools() {
			known = known || t.Name == name
		}
		if !known && !(b.cfg.ReplyOnly && name != "receive") {
			return errorResponse(req.id, codeInvalidParams, "Unknown tool: "+name)
		}
		meta, _, _ := params.Raw("_meta")
		return result(req.id, b.call(ctx, name, args, identityMeta(meta)))
	}
	return errorResponse(req.id, codeMethodNotFound, "Method not found: "+req.method)
}

func orEmpty(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}")
	}
	return raw
}

func (b *bridge) initialize(params json.RawMessage) map[string]any {
	var asked string
	if p, err := jsonline.Decode(orEmpty(params)); err == nil {
		asked, _ = p.String("protocolVersion")
	}
	version := versions[0]
	for _, v := range versions {
		if asked == v {
			version = v
		}
	}
	return map[string]any{
		"protocolVersion": version,
		"capabilities":    map[string]any{"tools": map[string]any{"listChanged": false}},
		"serverInfo":      map[string]any{"name": "xmsg", "version": b.cfg.Version},
	}
}

type tool struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	InputSchema map[string]any `json:"inputSchema"`
}

func schema(props map[string]any, required ...string) map[string]any {
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

var allTools = []tool{
	{
		Name:        "list",
		Description: "List the live agent sessions and services on the xmsg bus.",
		InputSchema: schema(map[string]any{
			"host": map[string]any{"type": "string", "description": "list the sessions of this federated peer host instead of the local ones"},
		}),
	},
	{
		Name: "send",
		Description: "Send a message to another agent session or service. The sender is attested by xmsg " +
			"from this session; replies come back as messages with 'reply to message_id=<id>'.",
		InputSchema: schema(map[string]any{
			"ref":          map[string]any{"type": "string", "description": "target: a session id, pid, name, svc:<name>, or <target>@<host>"},
			"text":         map[string]any{"type": "string", "description": "message text"},
			"push_replies": map[string]any{"type": "boolean", "description": "push replies back to this session (default true)", "default": true},
		}, "ref", "text"),
	},
	{
		Name:        "reply",
		Description: "Reply to a message you received (its message_id is in the message).",
		InputSchema: schema(map[string]any{
			"message_id": map[string]any{"type": "string", "description": "id of the message being answered"},
			"text":       map[string]any{"type": "string", "description": "reply text"},
		}, "message_id", "text"),
	},
	{
		Name: "receive",
		Description: "Codex threads: read the messages queued for this thread, oldest first (at most " +
			"20 per call). Each comes with its message_id for reply. Other sessions receive theirs directly.",
		InputSchema: schema(map[string]any{}),
	},
}

// ToolNames is every tool the bridge can offer, in tools/list's order (`xmsg mcp --help` and
// the docs name them from here).
func ToolNames() []string {
	out := make([]string, len(allTools))
	for i, t := range allTools {
		out[i] = t.Name
	}
	return out
}

func (b *bridge) tools() []tool {
	switch {
	case b.cfg.ReplyOnly:
		return []tool{allTools[2]}
	case b.codex:
		return allTools
	}
	// Every other session (Claude, pi, agy, a service, none) gets its messages delivered,
	// never through a queue read here.
	return allTools[:3]
}

// underCodex asks agent.sock which harness this process descends from; only a trusted Codex
// process makes receive meaningful. An unreachable daemon offers no receive.
func (b *bridge) underCodex(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ans, err := b.agentFrames(ctx, []map[string]any{{"action": "harness"}})
	if err != nil {
		b.cfg.Log.Debug("mcp: harness of the ancestry unknown", "err", err)
		return false
	}
	obj, err := jsonline.Decode(ans[0].raw)
	if err != nil {
		return false
	}
	h, _ := obj.String("harness")
	return h == "codex"
}

type content struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type toolResult struct {
	Content []content `json:"content"`
	IsError bool      `json:"isError"`
	// afterWrite runs once the result is written to the client (receive acks its messages).
	afterWrite func(context.Context)
}

func text(s string, isError bool) toolResult {
	return toolResult{Content: []content{{Type: "text", Text: s}}, IsError: isError}
}

// call runs one tool. Failures are tool results with isError (visible to the model), not
// JSON-RPC errors.
func (b *bridge) call(ctx context.Context, name string, args jsonline.Object, meta map[string]json.RawMessage) toolResult {
	if _, ok := args["from"]; ok {
		// The sender is whoever the daemon attests; accepting a claimed name here (even to
		// ignore it) would suggest to the agent that it can choose one.
		return text("the 'from' argument is not accepted: xmsg attests the sender from this session", true)
	}
	if b.cfg.ReplyOnly && name != "reply" {
		return text(fmt.Sprintf("the %s tool is not available: this bridge is reply-only", name), true)
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if name == "receive" {
		return b.receive(ctx, meta)
	}
	res := b.run(ctx, name, args, meta)
	if meta != nil {
		// A Codex thread reads its mail only by calling receive: every other result tells it
		// how much waits, so a model that never calls receive still learns of it.
		if n, err := b.waiting(ctx, meta); err == nil && n > 0 {
			res.Content = append(res.Content, content{Type: "text", Text: waitingNotice(n)})
		}
	}
	return res
}

// run runs list, send or reply.
func (b *bridge) run(ctx context.Context, name string, args jsonline.Object, meta map[string]json.RawMessage) toolResult {
	switch name {
	case "list":
		host, err := argString(args, "host")
		if err != nil {
			return text(err.Error(), true)
		}
		return b.list(ctx, host)
	case "send":
		ref, err1 := argString(args, "ref")
		msg, err2 := argString(args, "text")
		push, given, err3 := args.Bool("push_replies", "pushReplies")
		if err3 != nil {
			err3 = errors.New("push_replies must be a boolean")
		}
		if !given {
			push = true
		}
		if err := errors.Join(err1, err2, err3); err != nil {
			return text(err.Error(), true)
		}
		if ref == "" || msg == "" {
			return text("ref and text are required", true)
		}
		return b.agent(ctx, withMeta(map[string]any{"action": "send", "ref": ref, "text": msg, "push_replies": push}, meta), "delivery")
	default: // reply
		id, err1 := argString(args, "message_id", "messageId")
		msg, err2 := argString(args, "text")
		if err := errors.Join(err1, err2); err != nil {
			return text(err.Error(), true)
		}
		if id == "" || msg == "" {
			return text("message_id and text are required", true)
		}
		return b.agent(ctx, withMeta(map[string]any{"action": "reply", "messageId": id, "text": msg}, meta), "reply")
	}
}

// identityMeta keeps the members of params._meta that name a Codex session (sessionId,
// threadId, turn_id). Codex writes _meta itself; the model writes only the arguments, so these
// are taken from _meta alone and never from arguments of the same names.
func identityMeta(raw json.RawMessage) map[string]json.RawMessage {
	var all map[string]json.RawMessage
	if json.Unmarshal(raw, &all) != nil {
		return nil
	}
	out := map[string]json.RawMessage{}
	for _, k := range []string{"sessionId", "threadId", "turn_id"} {
		if v, ok := all[k]; ok {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// withMeta adds the identity _meta to an agent.sock frame; the daemon attests it.
func withMeta(frame map[string]any, meta map[string]json.RawMessage) map[string]any {
	if meta != nil {
		frame["_meta"] = meta
	}
	return frame
}

// argString is a string argument under the first present of names; its error names the
// argument by its canonical name, as the tool's schema does.
func argString(args jsonline.Object, names ...string) (string, error) {
	s, err := args.String(names...)
	if err != nil {
		return "", fmt.Errorf("%s must be a string", names[0])
	}
	return s, nil
}

// agent sends one request line to agent.sock on a fresh connection and turns the answer into
// a tool result: the `key` object of an ok answer as JSON text, or the error code and detail.
func (b *bridge) agent(ctx context.Context, req map[string]any, key string) toolResult {
	ans, err := b.agentFrames(ctx, []map[string]any{req})
	if err != nil {
		return text(err.Error(), true)
	}
	obj, err := jsonline.Decode(ans[0].raw)
	if err != nil {
		return text("xmsg sent an unreadable answer", true)
	}
	body, ok := obj[key]
	if !ok {
		body = bytes.TrimSuffix(ans[0].raw, []byte("\n"))
	}
	return text(string(body), false)
}

// list asks http.sock for the session list (or a peer's, with host).
func (b *bridge) list(ctx context.Context, host string) toolResult {
	u := "http://localhost/v1/sessions"
	if host != "" {
		u += "?peer=" + url.QueryEscape(host)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return text("bad request: "+err.Error(), true)
	}
	resp, err := b.http.Do(req)
	if err != nil {
		b.cfg.Log.Debug("mcp: http.sock request failed", "err", err)
		return text("xmsg is not reachable: "+errText(err), true)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return text("xmsg answer unreadable: "+errText(err), true)
	}
	if resp.StatusCode != http.StatusOK {
		return text(fmt.Sprintf("error %d: %s", resp.StatusCode, strings.TrimSpace(string(body))), true)
	}
	return text(strings.TrimSpace(string(body)), false)
}

// errText names a connection failure without the socket path.
func errText(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return errText(ue.Err)
	}
	return err.Error()
}

// agyPresence keeps an mcp_start connection to agent.sock until ctx ends: the daemon attests
// the agy session from it (docs/protocol.md §2.8). A refusal (not below an attested agy process)
// ends it for good; a lost connection is re-made after a backoff of 1 s doubling to 30 s.
func (b *bridge) agyPresence(ctx context.Context) {
	backoff := time.Second
	for ctx.Err() == nil {
		refused := b.agyStartOnce(ctx)
		if refused {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// agyStartOnce sends mcp_start and holds the connection until it ends. It reports whether
// the daemon refused the attestation.
func (b *bridge) agyStartOnce(ctx context.Context) (refused bool) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", b.cfg.AgentSock)
	if err != nil {
		return false
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })()
	if _, err := c.Write([]byte(`{"action":"mcp_start"}` + "\n")); err != nil {
		return false
	}
	r := bufio.NewReader(c)
	line, err := jsonline.ReadLine(r, maxResponse)
	if err != nil {
		return false
	}
	var ans struct{ Status, Error, Detail, SessionID string }
	if json.Unmarshal(line, &ans) != nil {
		return false
	}
	if ans.Status != "ok" {
		b.cfg.Log.Warn("mcp: agy attestation refused", "code", ans.Error, "detail", ans.Detail)
		return ans.Error == ledger.Unattested.String()
	}
	b.cfg.Log.Debug("mcp: agy session attested", "session_id", ans.SessionID)
	io.Copy(io.Discard, r) // until the daemon closes it (restart, idle timeout)
	return false
}
