package registersock

import (
	"encoding/json"
	"testing"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/harness"
)

// FuzzDecodeFirst: every first frame is classified into exactly one kind; only JSON objects
// are accepted; a registration kind always names its harness.
func FuzzDecodeFirst(f *testing.F) {
	for _, s := range []string{
		`{"action":"check","conversation_id":"c"}`,
		`{"action":"has_credentials","conversationId":"c"}`,
		`{"harness":"svc","name":"matrix-xmsg","cwd":"/"}`,
		`{"harness":"svc","name":"svc:bot"}`,
		`{"harness":"pi","sessionName":"a","sessionId":"pi:claimed","cwd":"/w"}`,
		`{"harness":"opencode","session_name":"b"}`,
		`{"harness":"hermes"}`,
		`{"conversation_id":"c","ls_address":"127.0.0.1:1","csrf_token":"t"}`,
		`{"harness":5}`, `{"harness":null,"action":null}`, `[]`, `null`, `x`, ``, `{} {}`,
	} {
		f.Add([]byte(s))
	}
	hs, _ := harness.NewRegistry(bus.Builtin()...) // the builtin names and prefixes are distinct
	f.Fuzz(func(t *testing.T, line []byte) {
		fr, err := decodeFirst(line, hs)
		if err != nil {
			return
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(line, &obj) != nil || obj == nil {
			t.Fatalf("accepted %q, which is not a JSON object", line)
		}
		switch fr.Kind {
		case kindCheck, kindAgy:
		case kindService:
			if fr.Harness != "" {
				t.Fatalf("svc with harness %q", fr.Harness)
			}
		case kindSession:
			if !hs.Is(fr.Harness, harness.UID) {
				t.Fatalf("session kind with harness %q", fr.Harness)
			}
		default:
			t.Fatalf("kind %q", fr.Kind)
		}
	})
}

// FuzzDecodeLoop: waitSecs always ends up within 0..60; only JSON objects are accepted.
func FuzzDecodeLoop(f *testing.F) {
	for _, s := range []string{
		`{"action":"poll","waitSecs":30}`, `{"action":"poll"}`, `{"action":"poll","waitSecs":1e308}`,
		`{"action":"poll","waitSecs":-1}`, `{"action":"poll","waitSecs":0.5}`, `{"action":"poll","wait_secs":2}`,
		`{"action":"poll","waitSecs":"x"}`, `{"action":"ack","messageId":"m"}`, `{"action":"ack","message_id":"m"}`,
		`{"action":"reply","messageId":"m","text":"t"}`, `{"action":1}`, `[]`, `nope`,
		`{"action":"poll","ack":"m"}`, `{"action":"poll","ack":""}`, `{"action":"poll","ack":1}`, `{"ack":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := decodeLoop(line)
		if err != nil {
			return
		}
		if req.WaitSecs < 0 || req.WaitSecs > 60 {
			t.Fatalf("waitSecs %d out of range for %q", req.WaitSecs, line)
		}
		if !json.Valid(line) {
			t.Fatalf("accepted invalid JSON %q", line)
		}
		// An ack present (and not null) is never taken as no ack: it names a message.
		var obj map[string]json.RawMessage
		if json.Unmarshal(line, &obj) == nil {
			if raw, ok := obj["ack"]; ok && string(raw) != "null" && req.Ack == "" {
				t.Fatalf("accepted %q with an empty ack", line)
			}
		}
	})
}
