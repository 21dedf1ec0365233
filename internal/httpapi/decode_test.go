package httpapi

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestDecodeSend(t *testing.T) {
	cases := []struct {
		body    string
		wantErr bool
		want    SendRequest
	}{
		{`{"from":"a","text":"b"}`, false, SendRequest{From: "a", Text: "b"}},
		{`{"from":"a","text":"b","idempotencyKey":"k"}`, false, SendRequest{From: "a", Text: "b", IdempotencyKey: "k", IdempotencyKeyAlias: "k"}},
		{`{"from":"a","text":"b","idempotency_key":"k1","idempotencyKey":"k2"}`, false, SendRequest{From: "a", Text: "b", IdempotencyKey: "k1", IdempotencyKeyAlias: "k2"}},
		{`{"from":"a","text":"b","extra":1}`, true, SendRequest{}},
		{`{"from":"a","text":"b"}{}`, true, SendRequest{}},
		{`{"from":"a","text":"b"} x`, true, SendRequest{}},
		{"{\"from\":\"a\",\"text\":\"\xc3\"}", true, SendRequest{}},
		{`[]`, true, SendRequest{}},
		{``, true, SendRequest{}},
	}
	for _, c := range cases {
		got, err := DecodeSend([]byte(c.body))
		if (err != nil) != c.wantErr || (!c.wantErr && got != c.want) {
			t.Errorf("DecodeSend(%q) = %+v, %v; want %+v, err=%v", c.body, got, err, c.want, c.wantErr)
		}
	}
}

// FuzzDecodeSend: never panics; anything accepted is valid UTF-8 JSON whose fields round-trip.
func FuzzDecodeSend(f *testing.F) {
	for _, s := range []string{`{"from":"a","text":"b"}`, `{"text":"\u0000"}`, `{"from":"a","text":"b","idempotency_key":"k"}`, "{\"text\":\"\xff\"}", `{"x":1}`, `null`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeSend(body)
		if err != nil {
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("accepted invalid UTF-8 %q", body)
		}
		if !utf8.ValidString(req.Text) || !utf8.ValidString(req.From) {
			t.Fatal("decoded invalid UTF-8")
		}
		raw, _ := json.Marshal(req)
		var back SendRequest
		if err := json.Unmarshal(raw, &back); err != nil || back != req {
			t.Fatalf("round trip: %+v -> %+v (%v)", req, back, err)
		}
	})
}
