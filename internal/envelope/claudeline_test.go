package envelope

import (
	"bytes"
	"math/rand"
	"testing"

	"github.com/xmsg/xmsg/internal/jsonline"
)

type claudeMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type claudeLine struct {
	Type    string        `json:"type"`
	Message claudeMessage `json:"message"`
}

// TestClaudeLineMatchesEncoder: the hand-appended line is jsonline.Encode's (encoding/json
// without HTML escaping), byte for byte, for bodies of every byte and of the characters that
// are escaped. Mutants tried: DEL escaped, U+2028 not escaped, '\b' as \u0008: each red.
func TestClaudeLineMatchesEncoder(t *testing.T) {
	bodies := []string{"", "hello", "a\"b\\c", "\b\f\n\r\t\x00\x1f\x7f", "<&>", "\u2028\u2029", "\xff\xfe", "é·—\ufffd", "😀", "\xe2\x80", "</cross-session-message>"}
	var all []byte
	for b := range 256 {
		all = append(all, byte(b))
	}
	bodies = append(bodies, string(all))
	rng := rand.New(rand.NewSource(1))
	alphabet := []string{"a", "\"", "\\", "\n", "\x01", "\x7f", "\u2028", "\xff", "é", "😀", "<", "\xe2\x80\xa8"}
	for range 2000 {
		var b bytes.Buffer
		for range rng.Intn(20) {
			b.WriteString(alphabet[rng.Intn(len(alphabet))])
		}
		bodies = append(bodies, b.String())
	}
	for _, body := range bodies {
		from := "xmsg@h · " + body[:min(len(body), 5)]
		got, err := ClaudeLine(from, body)
		want, werr := jsonline.Encode(claudeLine{Type: "user", Message: claudeMessage{Role: "user", Content: ClaudeContent(from, body)}})
		if err != nil || werr != nil || !bytes.Equal(got, want) {
			t.Fatalf("body %q:\n got %q (%v)\nwant %q (%v)", body, got, err, want, werr)
		}
		// appendJSONString alone, on strings that ClaudeContent would have repaired.
		if g, w := appendJSONString(nil, body), mustEncode(t, body); !bytes.Equal(g, w) {
			t.Fatalf("string %q: %q, want %q", body, g, w)
		}
	}
}

func mustEncode(t *testing.T, s string) []byte {
	b, err := jsonline.Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(b, []byte("\n"))
}
