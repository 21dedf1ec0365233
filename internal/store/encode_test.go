package store

import (
	"bytes"
	"encoding/json"
	"github.com/xmsg/xmsg/internal/ledger"
	"testing"
)

// A hand-written row must be json.Marshal's bytes, so that rows written before and after read
// the same: every field, each optional one present and absent, and every kind of escape.
func TestAppendMessageIsMarshal(t *testing.T) {
	odd := "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀"
	for _, m := range []Message{
		{},
		{ID: "019a-x", CreatedAt: -3, SessionID: "s", FromName: "f", Bytes: 200, Outcome: ledger.Delivered, RecipientHarness: "claude", ThreadID: "t"},
		{ID: odd, CreatedAt: 1 << 62, SessionID: odd, FromName: odd, Bytes: -1, Outcome: ledger.Outcome(200), RecipientHarness: odd,
			ReturnHarness: odd, ReturnSessionID: odd, ReturnHost: odd, PushReplies: true, ThreadID: odd, Report: odd},
		{ReturnHost: "h"}, {Report: "written"}, {ReturnSessionID: "r"},
	} {
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendMessage(nil, m); !bytes.Equal(got, want) {
			t.Errorf("appendMessage = %s, want %s", got, want)
		}
	}
}

func FuzzAppendMessage(f *testing.F) {
	f.Add("id", int64(1), "s", "from<&>", 3, uint8(1), "claude", "", "sid", "", true, "t", "written")
	f.Add("\xff", int64(-1), "\u2028", "\x00\"\\", 0, uint8(255), "", "h", "", "host", false, "", "")
	f.Fuzz(func(t *testing.T, id string, at int64, sid, from string, n int, outcome uint8, harness, rh, rs, host string, push bool, thread, report string) {
		m := Message{ID: id, CreatedAt: at, SessionID: sid, FromName: from, Bytes: n, Outcome: ledger.Outcome(outcome), RecipientHarness: harness,
			ReturnHarness: rh, ReturnSessionID: rs, ReturnHost: host, PushReplies: push, ThreadID: thread, Report: report}
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendMessage(nil, m); !bytes.Equal(got, want) {
			t.Errorf("appendMessage = %q, want %q", got, want)
		}
	})
}

func TestAppendPendingIsMarshal(t *testing.T) {
	odd := "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀"
	for _, p := range []Pending{
		{},
		{ID: "id", SessionID: "svc:x", CreatedAt: 7, FromName: "f", Bytes: 3, Text: "hi", Envelope: "env", Origin: json.RawMessage(`{"kind":"anonymous"}`)},
		{ID: odd, Share: odd, SessionID: odd, CreatedAt: -1 << 60, FromName: odd, Bytes: -5, Text: odd, Envelope: odd,
			Origin: json.RawMessage(" {\"kind\" : \"local\", \"a\":[1, 2.5e3, true, null, \"<>&\u2028\u2029\\u003c\"]}\n")},
		{Share: "peer"}, {Origin: json.RawMessage(`"x"`)},
	} {
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := appendPending(nil, p); !ok || !bytes.Equal(got, want) {
			t.Errorf("appendPending = %s, %v, want %s", got, ok, want)
		}
	}
	// An origin that is not JSON is json.Marshal's to refuse.
	if _, ok := appendPending(nil, Pending{Origin: json.RawMessage(`{"kind":`)}); ok {
		t.Error("appendPending took an origin that is not JSON")
	}
}

func FuzzAppendPending(f *testing.F) {
	f.Add("id", "", "svc:x", int64(1), "from<&>", 3, "text", "env", []byte(`{"kind":"anonymous"}`))
	f.Add("\xff", "peer", "\u2028", int64(-1), "\x00\"\\", 0, "", "", []byte(" [1, \"\u2029<\" ] "))
	f.Fuzz(func(t *testing.T, id, share, sid string, at int64, from string, n int, text, env string, origin []byte) {
		p := Pending{ID: id, Share: share, SessionID: sid, CreatedAt: at, FromName: from, Bytes: n, Text: text, Envelope: env, Origin: origin}
		want, err := json.Marshal(p)
		got, ok := appendPending(nil, p)
		if (err == nil) != ok {
			t.Fatalf("appendPending ok = %v, json.Marshal err = %v", ok, err)
		}
		if ok && !bytes.Equal(got, want) {
			t.Errorf("appendPending = %q, want %q", got, want)
		}
	})
}

func TestAppendMailboxIsMarshal(t *testing.T) {
	odd := "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀"
	for _, e := range []MailboxEntry{
		{},
		{ID: "id", Peer: "leaf", TargetRef: "svc:x", CreatedAt: 7, FromName: "f", Bytes: 3, Body: "hi", Envelope: []byte(`{"v":2}`), Origin: []byte(`{"kind":"fed"}`)},
		{ID: odd, Peer: odd, TargetRef: odd, CreatedAt: -1 << 60, FromName: odd, Bytes: -5, Body: odd, Envelope: []byte{}, Origin: []byte(odd)},
		{Envelope: []byte{0xff, 0, 1}},
	} {
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendMailbox(nil, e); !bytes.Equal(got, want) {
			t.Errorf("appendMailbox = %s, want %s", got, want)
		}
	}
}

func FuzzAppendMailbox(f *testing.F) {
	f.Add("id", "leaf", "svc:x", int64(1), "from<&>", 3, "body", []byte(`{"v":2}`), []byte(`{"kind":"fed"}`), false)
	f.Add("\xff", "\u2028", "", int64(-1), "\x00\"\\", 0, "", []byte{}, []byte{0xfe}, true)
	f.Fuzz(func(t *testing.T, id, peer, ref string, at int64, from string, n int, body string, env, origin []byte, nilEnv bool) {
		e := MailboxEntry{ID: id, Peer: peer, TargetRef: ref, CreatedAt: at, FromName: from, Bytes: n, Body: body, Envelope: env, Origin: origin}
		if nilEnv {
			e.Envelope = nil
		}
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendMailbox(nil, e); !bytes.Equal(got, want) {
			t.Errorf("appendMailbox = %q, want %q", got, want)
		}
	})
}

func TestAppendOutboundIsMarshal(t *testing.T) {
	odd := "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀"
	for _, o := range []Outbound{
		{},
		{ID: "id", Peer: "leaf", TargetRef: "svc:x", Outcome: ledger.Queued, CreatedAt: 7},
		{ID: odd, Peer: odd, TargetRef: odd, Outcome: ledger.Outcome(200), CreatedAt: -1 << 60},
	} {
		want, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendOutbound(nil, o); !bytes.Equal(got, want) {
			t.Errorf("appendOutbound = %s, want %s", got, want)
		}
	}
}

func FuzzAppendOutbound(f *testing.F) {
	f.Add("id", "leaf", "svc:x", uint8(2), int64(1))
	f.Add("\xff", "\u2028", "<&>", uint8(255), int64(-1))
	f.Fuzz(func(t *testing.T, id, peer, ref string, outcome uint8, at int64) {
		o := Outbound{ID: id, Peer: peer, TargetRef: ref, Outcome: ledger.Outcome(outcome), CreatedAt: at}
		want, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendOutbound(nil, o); !bytes.Equal(got, want) {
			t.Errorf("appendOutbound = %q, want %q", got, want)
		}
	})
}
