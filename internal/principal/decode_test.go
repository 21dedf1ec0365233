package principal

import (
	"encoding/json"
	"testing"
)

// Decode reads what json.Unmarshal reads, and fails where it fails; the shape a node writes
// takes the one pass.
func TestDecodeIsUnmarshal(t *testing.T) {
	for _, c := range []struct {
		raw   string
		quick bool
	}{
		{`{"kind":"session","harness":"claude","session_id":"s1","name":"alice"}`, true},
		{`{"kind":"service","name":"matrix"}`, true},
		{` { "kind" : "anonymous" , "from" : "bob" } `, true},
		{`{}`, true},
		{`{"kind":"session","kind":"service"}`, true}, // the last wins
		{`{"Kind":"service"}`, false},                 // matched whatever its case
		{`{"kind":"service","extra":1}`, false},       // skipped
		{`{"kind":"ser\u0076ice"}`, false},            // an escape
		{`{"kind":null}`, false},                      // left as it was
		{`{"kind":"service"`, false},                  // refused
		{`{"kind":"service"} x`, false},               // refused
		{`[]`, false},                                 // refused
		{"{\"kind\":\"a\tb\"}", false},                // a raw control character: refused
		{"{\"from\":\"\xff\"}", false},                // not UTF-8: read as U+FFFD
		{`{"kind":"service","name":"é😀<>&"}`, true},
		{`{"kind":1}`, false}, // refused
	} {
		want, werr := Principal{}, error(nil)
		werr = json.Unmarshal([]byte(c.raw), &want)
		got, err := Decode([]byte(c.raw))
		if (err != nil) != (werr != nil) || err == nil && got != want {
			t.Errorf("Decode(%s) = %+v, %v; json.Unmarshal: %+v, %v", c.raw, got, err, want, werr)
		}
		if _, ok := quick([]byte(c.raw)); ok != c.quick {
			t.Errorf("quick(%s) took it: %v, want %v", c.raw, ok, c.quick)
		}
	}
	// What this node writes is read in one pass.
	for _, p := range []Principal{{Kind: Session, Harness: "claude", SessionID: "0198-x", Name: "alice"}, {Kind: Service, Name: "m"}, {Kind: Anonymous, From: "bob"}} {
		raw, _ := json.Marshal(p)
		if got, ok := quick(raw); !ok || got != p {
			t.Errorf("quick(%s) = %+v, %v", raw, got, ok)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"kind":"session","harness":"claude","session_id":"s1","name":"alice"}`, `{"kind":"a","kind":"b"}`,
		`{"KIND":"x"}`, ` {"from" : "\u00e9"} `, `{"name":"x","z":[1,{"a":2}]}`, `{}`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want Principal
		werr := json.Unmarshal(raw, &want)
		got, err := Decode(raw)
		if (err != nil) != (werr != nil) || err == nil && got != want {
			t.Errorf("Decode(%q) = %+v, %v; json.Unmarshal: %+v, %v", raw, got, err, want, werr)
		}
	})
}

func TestAppendIsMarshal(t *testing.T) {
	odd := "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀"
	for _, p := range []Principal{{}, {Kind: Session, Harness: "claude", SessionID: "s", Name: "alice"}, {Kind: Service, Name: "m"},
		{Kind: Anonymous, From: "bob"}, {Kind: Kind(odd), Harness: odd, SessionID: odd, Name: odd, From: odd}} {
		want, _ := json.Marshal(p)
		if got := Append(nil, p); string(got) != string(want) {
			t.Errorf("Append(%+v) = %s, want %s", p, got, want)
		}
	}
}

func FuzzAppend(f *testing.F) {
	f.Add("session", "claude", "s", "alice", "")
	f.Add("\xff<", "", "\u2028", "", "&")
	f.Fuzz(func(t *testing.T, kind, harness, session, name, from string) {
		p := Principal{Kind: Kind(kind), Harness: harness, SessionID: session, Name: name, From: from}
		want, _ := json.Marshal(p)
		if got := Append(nil, p); string(got) != string(want) {
			t.Errorf("Append(%+v) = %s, want %s", p, got, want)
		}
	})
}
