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
