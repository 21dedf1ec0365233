package agentsock

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeRequest: any line either fails to decode or yields a request that survives a
// round trip (under its canonical names and under its aliases), and only valid UTF-8 JSON
// objects decode.
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
		// The request written with the canonical names, and again with every alias, decodes
		// to the same request: aliases are folded into the canonical fields.
		for _, names := range [][6]string{
			{"action", "ref", "text", "idempotency_key", "messageId", "push_replies"},
			{"action", "ref", "text", "idempotencyKey", "message_id", "pushReplies"},
		} {
			obj := map[string]any{names[0]: req.Action, names[1]: req.Ref, names[2]: req.Text, names[3]: req.Key, names[4]: req.MessageID}
			if req.PushReplies != nil {
				obj[names[5]] = *req.PushReplies
			}
			out, err := json.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			again, err := decodeRequest(out)
			if err != nil {
				t.Fatalf("re-decode of %s: %v", out, err)
			}
			if again.Action != req.Action || again.Ref != req.Ref || again.Text != req.Text || again.Key != req.Key ||
				again.MessageID != req.MessageID || (again.PushReplies == nil) != (req.PushReplies == nil) ||
				(req.PushReplies != nil && *again.PushReplies != *req.PushReplies) {
				t.Fatalf("round trip of %s changed %+v into %+v", out, req, again)
			}
		}
	})
}

// BenchmarkDecodeRequest: the send frame xmsg bench sends (200 bytes of text).
func BenchmarkDecodeRequest(b *testing.B) {
	line := []byte(`{"action":"send","ref":"11111111-2222-3333-4444-555555555555","text":"` + string(bytes.Repeat([]byte("x"), 200)) + `","push_replies":false}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeRequest(line); err != nil {
			b.Fatal(err)
		}
	}
}
