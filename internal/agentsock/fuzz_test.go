package agentsock

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeRequest: any line either fails to decode or yields a request that survives a
// round trip, and only valid UTF-8 JSON objects decode.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"action":"send","ref":"svc:bot","text":"hi","push_replies":true,"idempotency_key":"k"}`,
		`{"action":"send","ref":"x","text":"y","pushReplies":false,"idempotencyKey":"k2","return_to":"svc:evil"}`,
		`{"action":"reply","messageId":"0190","text":"ok"}`,
		`{"action":"reply","message_id":"0190","text":"ok"}`,
		`{"action":"mcp_start"}`,
		`{"action":"send","ref":5}`,
		`{"action":"send"} {}`,
		`  {"action":"x"}  `,
		`[1]`, `null`, `"s"`, `{`, "{\"action\":\"\xff\"}", `{"text":"\u0000\u2028"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := decodeRequest(line)
		if err != nil {
			return
		}
		if !utf8.Valid(line) || !json.Valid(line) || bytes.TrimSpace(line)[0] != '{' {
			t.Fatalf("decoded %q, which is not a valid UTF-8 JSON object", line)
		}
		// Aliases are folded into the canonical fields.
		if req.PushReplies == nil && req.PushRepliesAlt != nil || req.Key == nil && req.KeyAlt != nil || req.MessageID == nil && req.MessageIDAlt != nil {
			t.Fatalf("alias not folded: %+v", req)
		}
		canon := request{Action: req.Action, Ref: req.Ref, Text: req.Text, PushReplies: req.PushReplies, Key: req.Key, MessageID: req.MessageID}
		out, err := json.Marshal(canon)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeRequest(out)
		if err != nil {
			t.Fatalf("re-decode of %s: %v", out, err)
		}
		if str(again.Ref) != str(req.Ref) || str(again.Text) != str(req.Text) || again.Action != req.Action ||
			str(again.Key) != str(req.Key) || str(again.MessageID) != str(req.MessageID) ||
			(again.PushReplies == nil) != (req.PushReplies == nil) || (req.PushReplies != nil && *again.PushReplies != *req.PushReplies) {
			t.Fatalf("round trip changed %+v into %+v", req, again)
		}
	})
}
