package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
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

// TestTCPRefusesBrowsers: the TCP listener (no peer check) refuses what a web page can make a
// browser send; the same requests from a plain client pass.
func TestTCPRefusesBrowsers(t *testing.T) {
	h := refuseBrowsers(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) }))
	cases := []struct {
		name, method, host, origin, ct string
		want                           int
	}{
		{"plain client", "POST", "127.0.0.1:7787", "", "application/json", 299},
		{"charset", "POST", "localhost:7787", "", "application/json; charset=utf-8", 299},
		{"get", "GET", "[::1]:7787", "", "", 299},
		{"cross-site form", "POST", "127.0.0.1:7787", "https://evil.example", "text/plain", 403},
		{"origin on get", "GET", "127.0.0.1:7787", "https://evil.example", "", 403},
		{"dns rebinding", "GET", "evil.example:7787", "", "", 403},
		{"text/plain", "POST", "127.0.0.1:7787", "", "text/plain", 415},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, "http://"+c.host+"/v1/sessions", nil)
		r.Host = c.host
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if c.ct != "" {
			r.Header.Set("Content-Type", c.ct)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s: got %d, want %d", c.name, w.Code, c.want)
		}
	}
}
