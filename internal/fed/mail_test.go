package fed

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/principal"
)

const oddText = "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀"

// An envelope written by hand is json.Marshal's bytes: a leaf's mail keeps it, and what a
// hub of an earlier version wrote there reads the same.
func TestAppendEnvelopeIsMarshal(t *testing.T) {
	for _, e := range []Envelope{{}, {V: Version, ID: "0198-x", Principal: principal.Principal{Kind: principal.Session, Harness: "claude", SessionID: "s", Name: "alice"},
		Body: "hi", PushReplies: true, ThreadID: "t", CreatedAt: 7}, {V: -1, ID: oddText, Principal: principal.Principal{Kind: principal.Anonymous, From: oddText},
		Body: oddText, ThreadID: oddText, CreatedAt: -1 << 60}} {
		e.To.Ref = "svc:bot"
		want, _ := json.Marshal(e)
		if got := appendEnvelope(nil, e, principal.Append(nil, e.Principal)); !bytes.Equal(got, want) {
			t.Errorf("appendEnvelope = %s, want %s", got, want)
		}
	}
}

func FuzzAppendEnvelope(f *testing.F) {
	f.Add(2, "id", "session", "claude", "s", "alice", "", "svc:x", "body", true, "t", int64(1))
	f.Add(-1, "\xff", "anonymous", "", "", "", "<&>", "\u2028", "", false, "", int64(-1))
	f.Fuzz(func(t *testing.T, v int, id, kind, harness, session, name, from, ref, body string, push bool, thread string, at int64) {
		e := Envelope{V: v, ID: id, Principal: principal.Principal{Kind: principal.Kind(kind), Harness: harness, SessionID: session, Name: name, From: from},
			Body: body, PushReplies: push, ThreadID: thread, CreatedAt: at}
		e.To.Ref = ref
		want, _ := json.Marshal(e)
		if got := appendEnvelope(nil, e, principal.Append(nil, e.Principal)); !bytes.Equal(got, want) {
			t.Errorf("appendEnvelope = %q, want %q", got, want)
		}
	})
}

// checkMailRow fails t unless the row mailOf builds for s is the one the hub builds from the
// mail it keeps (hub.RowOf, as for mail read from the store after a restart).
func checkMailRow(t *testing.T, s bus.RemoteSend) {
	t.Helper()
	msg := s.Message("0198a8d2-7b8e-7cc1-9a55-3d5f2f7f0e11", "hub", ledger.Queued, 1700000000)
	mail, wire := mailOf(s, msg, "hub", 1700000000)
	want, err := hub.EncodeRow(hub.RowOf(mail))
	if err != nil || wire == nil || !bytes.Equal(wire, want) {
		t.Errorf("mailOf(%+v) row %s, want %s (%v)", s, wire, want, err)
	}
}

func TestMailRowIsRowOf(t *testing.T) {
	alice := principal.Principal{Kind: principal.Session, Harness: "claude", SessionID: "s1", Name: "alice"}
	for _, s := range []bus.RemoteSend{
		{Peer: "leaf", TargetRef: "svc:bot", Text: "hi", FromName: "alice", Bytes: 2, Principal: alice, Return: &bus.Caller{Harness: "claude", SessionID: "s1"}, PushReplies: true},
		{Peer: "leaf", TargetRef: "bot", Text: oddText, Principal: principal.Principal{Kind: principal.Anonymous, From: "bob<&>"}},
		// Push replies asked without a return address: the message does not push.
		{Peer: "leaf", TargetRef: "svc:bot", Text: "x", Principal: principal.Principal{Kind: principal.Anonymous, From: "bob"}, PushReplies: true},
		{Peer: "leaf", TargetRef: "svc:bot", Text: "x", Principal: principal.Principal{Kind: principal.Service, Name: oddText}, Return: &bus.Caller{Harness: "svc", SessionID: "svc:m"}},
	} {
		checkMailRow(t, s)
	}
}

func FuzzMailRow(f *testing.F) {
	f.Add("svc:bot", "hi", "session", "claude", "s1", "alice", "", true, true)
	f.Add("bot", "\xff<\u2028", "anonymous", "", "", "", "bob", false, false)
	f.Add("bot", "x", "anonymous", "", "", "", "bob", false, true)
	f.Fuzz(func(t *testing.T, ref, text, kind, harness, session, name, from string, ret, push bool) {
		s := bus.RemoteSend{Peer: "leaf", TargetRef: ref, Text: text, Principal: principal.Principal{Kind: principal.Kind(kind), Harness: harness, SessionID: session, Name: name, From: from}, PushReplies: push}
		if ret {
			s.Return = &bus.Caller{Harness: harness, SessionID: session}
		}
		checkMailRow(t, s)
	})
}
