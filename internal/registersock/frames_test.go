package registersock

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/xmsg/xmsg/internal/answer"
)

// FuzzQuickLoop: wherever the quick decoder takes a frame, it reads what decodeLoop reads;
// and it takes the plain frames clients send.
func FuzzQuickLoop(f *testing.F) {
	plain := []string{
		`{"action":"poll","waitSecs":30}`,
		`{"action":"poll","waitSecs":0}`,
		`{"action":"poll","wait_secs":90}`,
		`{"action":"poll"}`,
		`{"action":"ack","messageId":"0190a8d2-7b8e-7cc1-9a55-3d5f2f7f0e11"}`,
		`{"action":"ack","message_id":"m"}`,
		`{"action": "ack", "messageId": "m", "extra": 5}` + "\n",
		`{"action":"reply","messageId":"m","text":"héllo"}`,
		`{"action":"poll","waitSecs":30,"ack":"0190a8d2-7b8e-7cc1-9a55-3d5f2f7f0e11"}`,
		`{"ack":"m","action":"ack","messageId":"m"}`,
		`{"action":"poll","waitSecs":30,"max":64,"ack":"m"}`,
		`{"action":"poll","max":0}`,
		`{"action":"poll","max":1000}`,
		` {} `,
	}
	for _, s := range plain {
		if _, ok := quickLoop([]byte(s)); !ok {
			f.Fatalf("quickLoop refused the plain frame %s", s)
		}
		f.Add([]byte(s))
	}
	for _, s := range []string{
		`{"action":"poll","waitSecs":1.5}`, `{"action":"poll","waitSecs":-1}`, `{"action":"poll","waitSecs":"5"}`,
		`{"action":"a\"ck"}`, `{"action":null}`, `{"action":"poll","action":"ack"}`, `{"messageId":"a","message_id":"b"}`,
		`{"waitSecs":5,"wait_secs":7}`, `{"action":"poll"} x`, `{"action":"poll",}`, `{"x":[1]}`, `[]`, `{"action":"poll","waitSecs":05}`,
		`{"action":5}`, `{"waitSecs":1e3}`, `{"text":"\u0041"}`, "{\"text\":\"\x01\"}", `{"x":1,"x":2}`,
		`{"action":"poll","ack":""}`, `{"action":"poll","ack":5}`, `{"ack":"a","ack":"b"}`, `{"ack":null}`, `{"ack":"\u0041"}`,
		`{"action":"poll","acks":["a","b"]}`, `{"acks":"a"}`, `{"acks":null}`, `{"acks":[""]}`, `{"max":2.5}`, `{"max":"2"}`, `{"max":-1}`, `{"max":1,"max":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		got, ok := quickLoop(line)
		if !ok {
			return
		}
		want, err := decodeLoop(line)
		if err != nil {
			t.Fatalf("quickLoop(%q) = %+v, but decodeLoop refuses it: %v", line, got, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("quickLoop(%q) = %+v, decodeLoop = %+v", line, got, want)
		}
	})
}

// FuzzAppendDeliver: the deliver frame written by hand is byte for byte encode's.
func FuzzAppendDeliver(f *testing.F) {
	f.Add("m", "xmsg@h · a", "hi <b> & \"q\" \\ \n\t\r\b\f\x01\x7f \u2028\u2029 \xff é 😀", "env", []byte(`{"kind":"anonymous"}`))
	f.Add("", "", "", "", []byte(nil))
	f.Add("id", "n", "t", "e", []byte(` { "kind" : "local", "a" : [1, 2] } `))
	f.Add("id", "n", "t", "e", []byte(`{"kind":`))
	f.Add("id", "n", "t", "e", []byte(`{"k":"<&>"}`))
	f.Fuzz(func(t *testing.T, id, from, text, env string, origin []byte) {
		d := answer.Deliver{Action: "deliver", MessageID: id, FromName: from, Text: text, Envelope: env, Origin: json.RawMessage(origin)}
		got, ok := appendDeliver(nil, d)
		want := encode(d)
		if !ok {
			if json.Valid(origin) {
				t.Fatalf("appendDeliver refused a valid origin %q", origin)
			}
			return
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("appendDeliver = %s\nencode        = %s", got, want)
		}
	})
}

// TestLoopAckField: a poll's ack is read by both decoders alike; an empty one, or one that is
// not a string, is refused by decodeLoop and left to it by quickLoop.
func TestLoopAckField(t *testing.T) {
	for _, tc := range []struct {
		line      string
		quick     bool   // quickLoop takes it
		ack, derr string // decodeLoop's Ack, or its error
	}{
		{`{"action":"poll","waitSecs":5,"ack":"m1"}`, true, "m1", ""},
		{`{"action":"poll","ack":"m1","waitSecs":5}`, true, "m1", ""},
		{`{"action":"poll","waitSecs":5}`, true, "", ""},
		{`{"action":"poll","ack":null}`, false, "", ""}, // null is no field, as for every field
		{`{"action":"poll","ack":"\u006d1"}`, false, "m1", ""},
		{`{"action":"poll","ack":""}`, false, "", "invalid json: field 'ack' must not be empty"},
		{`{"action":"poll","ack":5}`, false, "", "invalid json: field 'ack' must be a string"},
		{`{"action":"poll","ack":["m1"]}`, false, "", "invalid json: field 'ack' must be a string"},
		{`{"action":"poll","ack":"a","ack":"b"}`, false, "b", ""},
	} {
		req, err := decodeLoop([]byte(tc.line))
		switch {
		case tc.derr != "" && (err == nil || err.Error() != tc.derr):
			t.Errorf("decodeLoop(%s): got %+v, %v; want error %q", tc.line, req, err, tc.derr)
		case tc.derr == "" && (err != nil || req.Ack != tc.ack):
			t.Errorf("decodeLoop(%s): got ack %q, %v; want %q", tc.line, req.Ack, err, tc.ack)
		}
		got, ok := quickLoop([]byte(tc.line))
		if ok != tc.quick {
			t.Errorf("quickLoop(%s): ok %v, want %v", tc.line, ok, tc.quick)
		}
		if ok && !reflect.DeepEqual(got, req) {
			t.Errorf("quickLoop(%s) = %+v, decodeLoop = %+v", tc.line, got, req)
		}
	}
}
