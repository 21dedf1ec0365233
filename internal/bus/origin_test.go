package bus

import (
	"bytes"
	"encoding/json"
	"testing"
)

func fedOriginMarshal(host, principal string) []byte {
	raw, _ := json.Marshal(map[string]string{"kind": "fed", "host": host, "principal": principal})
	return raw
}

// A federated origin is json.Marshal's bytes, so that a row's origin reads the same whichever
// wrote it, and what a service is handed does not change.
func TestFedOriginIsMarshal(t *testing.T) {
	odd := "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀"
	for _, c := range [][2]string{{"hub", "claude:alice"}, {"", ""}, {odd, odd}, {"h<", "svc:&"}} {
		if got, want := FedOrigin(c[0], c[1]), fedOriginMarshal(c[0], c[1]); !bytes.Equal(got, want) {
			t.Errorf("FedOrigin(%q, %q) = %s, want %s", c[0], c[1], got, want)
		}
	}
}

func FuzzFedOrigin(f *testing.F) {
	f.Add("hub", "claude:alice")
	f.Add("\xff<", "\u2028\"")
	f.Fuzz(func(t *testing.T, host, principal string) {
		if got, want := FedOrigin(host, principal), fedOriginMarshal(host, principal); !bytes.Equal(got, want) {
			t.Errorf("FedOrigin(%q, %q) = %s, want %s", host, principal, got, want)
		}
	})
}

// An origin read in one pass is what json.Unmarshal reads, whatever the bytes; and the
// origins this daemon writes take the one pass.
func FuzzQuickOrigin(f *testing.F) {
	for _, s := range []string{`{"kind":"anonymous"}`, `{"harness":"claude","kind":"local","sessionId":"s1"}`, `{"host":"hub","kind":"fed","principal":"claude:alice"}`,
		`{"KIND":"fed"}`, `{"kind":"a","kind":"b"}`, `{"session_id":"x","sessionid":"y"}`, `{"x":[1],"kind":"fed"}`, "{\"\u212aind\":\"fed\"}", `null`, `{}`} {
		f.Add([]byte(s))
	}
	for _, raw := range [][]byte{FedOrigin("hub", "claude:alice"), fmtOrigin("anonymous", nil), fmtOrigin("local", &Caller{Harness: "claude", SessionID: "s1"})} {
		if _, ok := quickOrigin(raw); !ok {
			f.Fatalf("quickOrigin refused %s", raw)
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := quickOrigin(raw)
		if !ok {
			return
		}
		var want originFields
		if err := json.Unmarshal(raw, &want); err != nil || got != want {
			t.Fatalf("quickOrigin(%q) = %+v; json.Unmarshal: %+v, %v", raw, got, want, err)
		}
	})
}

// A local sender's origin is json.Marshal's bytes (what fmtOrigin wrote before it was written
// by hand), anonymous or with its caller.
func TestLocalOriginIsMarshal(t *testing.T) {
	odd := "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀"
	for _, kind := range []string{"anonymous", "local", odd} {
		for _, c := range []*Caller{nil, {Harness: "claude", SessionID: "s1"}, {Harness: odd, SessionID: odd}, {}} {
			var want []byte
			if c == nil {
				want, _ = json.Marshal(map[string]string{"kind": kind})
			} else {
				want, _ = json.Marshal(map[string]string{"kind": kind, "harness": c.Harness, "sessionId": c.SessionID})
			}
			if got := fmtOrigin(kind, c); !bytes.Equal(got, want) {
				t.Errorf("fmtOrigin(%q, %+v) = %s, want %s", kind, c, got, want)
			}
		}
	}
}
