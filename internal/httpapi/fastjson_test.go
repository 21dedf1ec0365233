package httpapi

import (
	"bytes"
	"math/rand"
	"testing"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
)

// slowDecode is DecodeSend without the fast path.
func slowDecode(body []byte) (SendRequest, error) {
	var req SendRequest
	err := decodeSendJSON(body, &req)
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = req.IdempotencyKeyAlias
	}
	return req, err
}

// TestFastSendDecodeMatches: whatever the fast path accepts, encoding/json decodes to the
// same request without error; bodies built from the pieces of send bodies (names, strings with
// escapes and control bytes, white space, separators) are tried by the thousand.
// Mutants tried: accepting a backslash in plainString; accepting an unknown name; not
// requiring the end after '}'. Each goes red here.
func TestFastSendDecodeMatches(t *testing.T) {
	pieces := []string{`{`, `}`, `:`, `,`, ` `, "\t", "\n", `"from"`, `"text"`, `"idempotency_key"`, `"idempotencyKey"`,
		`"From"`, `"x"`, `"a b"`, `"\n"`, `"\u00e9"`, "\"\x01\"", `"é·<&>"`, `""`, `1`, `null`, `[]`, `"`, `\`, `{}`}
	fixed := []string{`{"from":"a","text":"b"}`, ` { "text" : "t" , "from":"f" } `, `{"text":"a","text":"b"}`,
		`{"from":"a","text":"b","idempotencyKey":"k"}`, `{"idempotency_key":"k1","idempotencyKey":"k2"}`, `{}`, `{"text":"b"}x`,
		`{"text":"b",}`, `{"text":"b"}{}`, `{"text":"a\"b"}`, `{"TEXT":"a"}`}
	rng := rand.New(rand.NewSource(1))
	bodies := append([]string{}, fixed...)
	for range 20000 {
		var b bytes.Buffer
		b.WriteString(`{`)
		for range rng.Intn(12) {
			b.WriteString(pieces[rng.Intn(len(pieces))])
		}
		if rng.Intn(4) > 0 {
			b.WriteString(`}`)
		}
		bodies = append(bodies, b.String())
	}
	accepted := 0
	for _, s := range bodies {
		body := []byte(s)
		if !utf8.Valid(body) {
			continue
		}
		fast, ok := decodeSendFast(body)
		if !ok {
			continue
		}
		accepted++
		if fast.IdempotencyKey == "" {
			fast.IdempotencyKey = fast.IdempotencyKeyAlias
		}
		slow, err := slowDecode(body)
		if err != nil || slow != fast {
			t.Fatalf("%q: fast %+v; encoding/json %+v, %v", s, fast, slow, err)
		}
	}
	if accepted < 50 {
		t.Fatalf("the fast path took only %d bodies: the test proves little", accepted)
	}
	if _, ok := decodeSendFast([]byte(`{"from":"a","text":"b"}`)); !ok {
		t.Fatal("the plain body is not on the fast path")
	}
}

// TestFastDeliveryMatches: encodeDelivery writes jsonline.Encode's bytes, escapes or not.
// Mutant tried: plainJSON without the U+2028 check: red.
func TestFastDeliveryMatches(t *testing.T) {
	for _, s := range []string{"", "a", "xmsg@bench · load", "a\"b", `a\b`, "a\nb", "\x01", "<&>", "\u2028", "\u2029", "\xff", "é", "\x7f", "\ufffd"} {
		d := answer.Delivery{SessionID: "11111111-2222-3333-4444-555555555555", FromName: s, Bytes: 123, MessageID: s + "id", Outcome: ledger.Delivered}
		got, err := encodeDelivery(d)
		want, werr := jsonline.Encode(d)
		if err != nil || werr != nil || !bytes.Equal(got, want) {
			t.Errorf("%q: %q (%v), want %q (%v)", s, got, err, want, werr)
		}
	}
}
