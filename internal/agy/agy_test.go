package agy

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
)

const conv = "0199a3b2-1c4d-7e8f-9a0b-1c2d3e4f5a6b"

func decode(t testing.TB, s string) (Credentials, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &obj); err != nil {
		return Credentials{}, err
	}
	return DecodeCredentials(obj)
}

func TestDecodeCredentials(t *testing.T) {
	c, err := decode(t, `{"conversation_id":"`+strings.ToUpper(conv)+`","ls_address":"127.0.0.1:4242","csrf_token":"abc-123"}`)
	if err != nil || c != (Credentials{Conversation: conv, LSAddress: "127.0.0.1:4242", CSRFToken: "abc-123"}) {
		t.Fatalf("good frame: %+v, %v", c, err)
	}
	if c, err := decode(t, `{"conversationId":"`+conv+`","lsAddress":"a:1","csrfToken":"t"}`); err != nil || c.Conversation != conv {
		t.Fatalf("camelCase aliases: %+v, %v", c, err)
	}
	for _, bad := range []string{
		`{}`,
		`{"conversation_id":"../x","ls_address":"a:1","csrf_token":"t"}`,
		`{"conversation_id":"` + conv + `","ls_address":"a 1","csrf_token":"t"}`,
		`{"conversation_id":"` + conv + `","ls_address":"a:1","csrf_token":"t\n"}`,
		`{"conversation_id":"` + conv + `","ls_address":"a:1","csrf_token":"` + strings.Repeat("t", maxToken+1) + `"}`,
		`{"conversation_id":"` + conv + `","ls_address":5,"csrf_token":"t"}`,
		`{"conversation_id":"` + conv + `","ls_address":"a:1","csrf_token":"é"}`,
	} {
		if c, err := decode(t, bad); err == nil {
			t.Errorf("DecodeCredentials(%.80s) = %+v, want an error", bad, c)
		}
	}
}

func TestAuthFailure(t *testing.T) {
	for out, want := range map[string]bool{
		"rpc error: code = Unauthenticated desc = invalid CSRF token": true,
		"HTTP 401":               true,
		"connection refused":     false,
		"message sent to thread": false,
	} {
		if got := authFailure([]byte(out)); got != want {
			t.Errorf("authFailure(%q) = %v, want %v", out, got, want)
		}
	}
}

func FuzzDecodeCredentials(f *testing.F) {
	f.Add([]byte(`{"conversation_id":"` + conv + `","ls_address":"127.0.0.1:4242","csrf_token":"abc"}`))
	f.Add([]byte(`{"conversationId":"` + conv + `","lsAddress":"x","csrfToken":"y","extra":[1]}`))
	f.Add([]byte(`{"conversation_id":null}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := decode(t, string(raw))
		if err != nil {
			return
		}
		if u, err := uuid.Parse(c.Conversation); err != nil || u.String() != c.Conversation {
			t.Fatalf("accepted conversation %q", c.Conversation)
		}
		for _, v := range []string{c.LSAddress, c.CSRFToken} {
			if v == "" || strings.ContainsAny(v, " \t\r\n\x00") {
				t.Fatalf("accepted field %q", v)
			}
		}
	})
}
