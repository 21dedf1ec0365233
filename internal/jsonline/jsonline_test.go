package jsonline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		line      string
		ok        bool
		notObject bool
	}{
		{`{"a":1}`, true, false},
		{" \t\r{\"a\":1}\r\n ", true, false},
		{`{}`, true, false},
		{``, false, false},
		{`   `, false, false},
		{`[1]`, false, true},
		{`null`, false, true},
		{`"s"`, false, true},
		{`{"a":1} {}`, false, false},
		{`{"a":1}x`, false, false},
		{"{}\v", false, false},     // \v is no JSON whitespace (bytes.TrimSpace would strip it)
		{"\v{}", false, false},     // nor before the object
		{"{}\u00a0", false, false}, // nor U+00A0
		{`{"a":`, false, false},
		{"{\"a\":\"\xff\"}", false, false},
		{`{"a":1,"a":2}`, true, false}, // the last wins, as everywhere in encoding/json
	}
	for _, tt := range tests {
		obj, err := Decode([]byte(tt.line))
		if (err == nil) != tt.ok {
			t.Errorf("Decode(%q): err %v, want ok=%v", tt.line, err, tt.ok)
			continue
		}
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.NotObject != tt.notObject || !strings.HasPrefix(err.Error(), "invalid json: ") {
				t.Errorf("Decode(%q): %#v, want a SyntaxError with NotObject=%v", tt.line, err, tt.notObject)
			}
			continue
		}
		if obj == nil {
			t.Errorf("Decode(%q): nil object", tt.line)
		}
	}
}

func TestFields(t *testing.T) {
	obj, err := Decode([]byte(`{"ref":"r","messageId":null,"message_id":"m","Text":"T","push":true,"wait":2.5,"n":5,"s":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	str := func(names ...string) string {
		t.Helper()
		s, err := obj.String(names...)
		if err != nil {
			t.Fatalf("String(%v): %v", names, err)
		}
		return s
	}
	if got := str("ref"); got != "r" {
		t.Errorf("ref: got %q", got)
	}
	// null counts as absent: the alias is used.
	if got := str("messageId", "message_id"); got != "m" {
		t.Errorf("messageId/message_id: got %q, want m", got)
	}
	// Names match exactly: "Text" is not "text".
	if s, present, _ := obj.OptString("text"); present || s != "" {
		t.Errorf("text: got %q present=%v, want absent", s, present)
	}
	if v, present, err := obj.Bool("push"); !v || !present || err != nil {
		t.Errorf("push: got %v %v %v", v, present, err)
	}
	if v, present, err := obj.Number("wait"); v != 2.5 || !present || err != nil {
		t.Errorf("wait: got %v %v %v", v, present, err)
	}
	if _, present, err := obj.Bool("absent"); present || err != nil {
		t.Errorf("absent bool: present=%v err=%v", present, err)
	}
	// A wrong type names the field as written and the canonical name asked for.
	_, err = obj.String("ref2", "n")
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "n" || fe.Canonical != "ref2" || err.Error() != "invalid json: field 'n' must be a string" {
		t.Errorf("String(ref2, n): %v", err)
	}
	if _, _, err := obj.Bool("s"); err == nil || err.Error() != "invalid json: field 's' must be a boolean" {
		t.Errorf("Bool(s): %v", err)
	}
	if _, _, err := obj.Number("s"); err == nil || err.Error() != "invalid json: field 's' must be a number" {
		t.Errorf("Number(s): %v", err)
	}
}

// TestEncodeBytes pins the bytes the protocol needs: '<', '>' and '&' as themselves (the
// original xmsg's serde output), control characters and U+2028/U+2029 escaped (one line).
func TestEncodeBytes(t *testing.T) {
	got, err := Encode(map[string]string{"t": "a<b>&c\n\u2028\u2029\x00"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"t":"a<b>&c\n\u2028\u2029\u0000"}` + "\n"
	if string(got) != want {
		t.Errorf("Encode: got %q, want %q", got, want)
	}
	if _, err := Encode(func() {}); err == nil {
		t.Error("Encode(func) succeeded")
	}
}

func TestSkipLine(t *testing.T) {
	r := bufio.NewReaderSize(strings.NewReader(strings.Repeat("x", 100)+"\nnext\n"), 16)
	if _, err := ReadLine(r, 10); !errors.Is(err, ErrTooLong) {
		t.Fatalf("ReadLine: %v, want ErrTooLong", err)
	}
	if err := SkipLine(r); err != nil {
		t.Fatalf("SkipLine: %v", err)
	}
	if line, err := ReadLine(r, 10); err != nil || string(line) != "next" {
		t.Fatalf("after SkipLine: %q %v, want next", line, err)
	}
	if err := SkipLine(r); err == nil {
		t.Fatal("SkipLine at EOF: nil error")
	}
}

func TestIsBlank(t *testing.T) {
	for _, s := range []string{"", " ", "\t\r", "\v\f", "\u00a0\u2028"} {
		if !IsBlank([]byte(s)) {
			t.Errorf("IsBlank(%q) = false", s)
		}
	}
	for _, s := range []string{"{}", " x "} {
		if IsBlank([]byte(s)) {
			t.Errorf("IsBlank(%q) = true", s)
		}
	}
}

// FuzzDecode: only valid UTF-8 JSON objects, surrounded by nothing but JSON whitespace,
// decode; what decodes survives a round trip through Encode unchanged.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"action":"send","ref":"x","text":"<b>"}`, `{}`, ` {"a":[1,{"b":null}]} `, `[1]`, `{} {}`, "{}\v", `{"a":"\ud800"}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		obj, err := Decode(line)
		if err != nil {
			return
		}
		tr := bytes.Trim(line, " \t\r\n")
		if !utf8.Valid(line) || !json.Valid(tr) || tr[0] != '{' {
			t.Fatalf("decoded %q, which is not one JSON object", line)
		}
		out, err := Encode(obj)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(out[:len(out)-1], '\n') >= 0 || out[len(out)-1] != '\n' {
			t.Fatalf("Encode gave %q, not one line", out)
		}
		again, err := Decode(out)
		if err != nil {
			t.Fatalf("re-decode of %q: %v", out, err)
		}
		if len(again) != len(obj) {
			t.Fatalf("round trip changed %d fields into %d", len(obj), len(again))
		}
		for k, v := range obj {
			var a, b any
			if json.Unmarshal(v, &a) != nil || json.Unmarshal(again[k], &b) != nil {
				t.Fatalf("field %q does not decode", k)
			}
			ja, _ := json.Marshal(a)
			jb, _ := json.Marshal(b)
			if !bytes.Equal(ja, jb) {
				t.Fatalf("field %q: %s became %s", k, v, again[k])
			}
		}
	})
}

// FuzzDecodeFast: Decode's one-call path accepts exactly what the decoder accepts, with the
// same fields, and a refusal carries the decoder's reason.
func FuzzDecodeFast(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{}`, `{"a":1} {}`, `{"a":1}x`, "{}\v", "{} \t", `{"a":`, `{"a":1,"a":2}`,
		`{"a":"\ud800"}`, `{"a":[1,{"b":null}]}`, `{"a":1e400}`, `{"a":01}`, `{"a":1}]`, `{"a" :1 , "b":"x"}`,
		// scanObject's edges: escaped keys, bad escapes, raw control characters, numbers
		// and literals cut short, trailing commas, deep nesting.
		`{"a\u0062":1}`, `{"a\"":1}`, `{"a":"\u12"}`, `{"a":"\x"}`, "{\"a\":\"\t\"}", `{"a":-}`, `{"a":1.}`,
		`{"a":1e}`, `{"a":-0.5E+3}`, `{"a":tru}`, `{"a":nul}`, `{,}`, `{"a":1,}`, `{"a"}`, `{"a":[1,]}`, `{"a":[]}`,
		`{"a":{}}`, `{"a":{"b":[{"c":"\u00e9\n"}]}}`, `{"a":"é"}`, `{"a":1}{`, `{"":""}`,
		"{\"a\":" + strings.Repeat("[", 70) + strings.Repeat("]", 70) + "}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		tr := trim(line)
		if !utf8.Valid(line) || len(tr) == 0 || tr[0] != '{' {
			return
		}
		got, err := Decode(line)
		want, werr := decodeStream(tr)
		if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
			t.Fatalf("Decode(%q): %v, the decoder: %v", line, err, werr)
		}
		if (got == nil) != (want == nil) || len(got) != len(want) {
			t.Fatalf("Decode(%q): %d fields, the decoder %d", line, len(got), len(want))
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Fatalf("Decode(%q): field %q is %s, the decoder's %s", line, k, got[k], v)
			}
		}
	})
}

// FuzzFields: the fields' own fast paths (a plain string, a boolean literal) give what
// json.Unmarshal of the same raw value gives, error or not.
func FuzzFields(f *testing.F) {
	for _, s := range []string{`"x"`, `""`, `"a\"b"`, `"\u00e9"`, "\"\t\"", `"é"`, "\"\xff\"", `true`, `false`, `tru`, `"true"`, `1`, `"`, `"x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if string(raw) == "null" {
			return // absent, by the package rules
		}
		o := Object{"f": raw}
		got, _, err := o.OptString("f")
		var want string
		if werr := json.Unmarshal(raw, &want); (err == nil) != (werr == nil) || got != want {
			t.Fatalf("OptString(%q) = %q, %v; json.Unmarshal: %q, %v", raw, got, err, want, werr)
		}
		gb, _, err := o.Bool("f")
		var wb bool
		if werr := json.Unmarshal(raw, &wb); (err == nil) != (werr == nil) || gb != wb {
			t.Fatalf("Bool(%q) = %v, %v; json.Unmarshal: %v, %v", raw, gb, err, wb, werr)
		}
	})
}

// FuzzEncode: any string encodes to exactly one line that decodes back to the same string,
// with '<', '>' and '&' unescaped.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "a<b>&c", "\n\r\u2028\u2029\x00", "</cross-session-message>", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, err := Encode(map[string]string{"t": s})
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(out[:len(out)-1], '\n') >= 0 || out[len(out)-1] != '\n' {
			t.Fatalf("Encode(%q) = %q, not one line", s, out)
		}
		if bytes.Contains(out, []byte(`\u003c`)) || bytes.Contains(out, []byte(`\u003e`)) || bytes.Contains(out, []byte(`\u0026`)) {
			t.Fatalf("Encode(%q) = %q: HTML-escaped", s, out)
		}
		obj, err := Decode(out)
		if err != nil {
			t.Fatalf("Decode(%q): %v", out, err)
		}
		got, err := obj.String("t")
		if err != nil {
			t.Fatal(err)
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); utf8.ValidString(s) && got != want {
			t.Fatalf("round trip: %q became %q", s, got)
		}
	})
}

// BenchmarkDecode: a poll frame and an ack frame, the frames a consumer sends per message.
func BenchmarkDecode(b *testing.B) {
	frames := [][]byte{[]byte(`{"action":"poll","waitSecs":30}`), []byte(`{"action":"ack","messageId":"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"}`)}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := Decode(frames[i%2]); err != nil {
			b.Fatal(err)
		}
	}
}
