package store

import (
	"encoding/json"
	"fmt"
	"github.com/xmsg/xmsg/internal/ledger"
	"reflect"
	"testing"
)

// The rows of testdata/format1.db: written by fixturegen_test.go (run at the release of the
// format it writes), read back by TestMigrateFormat1Fixture after the migration. Only the API
// every format has is used here, so both sides compile at both releases.

const fixtureAt = 1_780_000_000 // createdAt of every row: fixed, so the file is the same each time

type fixtureRows struct {
	messages []Message
	replies  []Reply // to messages[0], in seq order
	queue    []Pending
	idem     []Idem
	procs    []ProcessSession
	outbound []Outbound
	mailbox  []MailboxEntry
}

func fixture() fixtureRows {
	const (
		msgClaude = "01900000-0000-7000-8000-000000000001"
		msgCodex  = "01900000-0000-7000-8000-000000000002"
		msgAgy    = "01900000-0000-7000-8000-000000000003"
		msgFed    = "01900000-0000-7000-8000-000000000004"
		msgMail   = "01900000-0000-7000-8000-000000000005"
		codexSess = "3f1c2d4e-0000-4000-8000-00000000c0de"
		agySess   = "3f1c2d4e-0000-4000-8000-0000000000a9"
		agyQueue  = "agy:conv-0001" // an agy conversation's queue
	)
	return fixtureRows{
		messages: []Message{
			{ID: msgClaude, CreatedAt: fixtureAt, SessionID: "c1a0de00-0000-4000-8000-000000000001", FromName: "xmsg@host · anon:ops", Bytes: 20, Outcome: ledger.Delivered, RecipientHarness: "claude", PushReplies: true, ThreadID: msgClaude},
			{ID: msgCodex, CreatedAt: fixtureAt, SessionID: codexSess, FromName: "xmsg@host · anon:ops", Bytes: 21, Outcome: ledger.Queued, RecipientHarness: "codex", ReturnHarness: "claude", ReturnSessionID: "c1a0de00-0000-4000-8000-000000000001", ThreadID: msgCodex},
			{ID: msgAgy, CreatedAt: fixtureAt, SessionID: agySess, FromName: "xmsg@host · anon:ops", Bytes: 22, Outcome: ledger.Queued, RecipientHarness: "agy", ThreadID: msgAgy},
			{ID: msgFed, CreatedAt: fixtureAt, SessionID: "peer:hub2", FromName: "xmsg@host · anon:ops", Bytes: 23, Outcome: ledger.NoOutcome /* the file holds "forwarded", a word no release wrote: it reads as none */, RecipientHarness: "remote", ReturnHost: "hub2", ThreadID: msgFed},
		},
		replies: []Reply{
			{Seq: 1, MessageID: msgClaude, CreatedAt: fixtureAt, ReplierSessionID: "c1a0de00-0000-4000-8000-000000000001", Text: "first reply", PushOutcome: ledger.Delivered, PushedMessageID: "01900000-0000-7000-8000-0000000000f1"},
			{Seq: 2, MessageID: msgClaude, CreatedAt: fixtureAt, ReplierSessionID: "c1a0de00-0000-4000-8000-000000000001", Text: "second reply, ünïcödé"},
		},
		queue: []Pending{
			{ID: msgCodex, SessionID: codexSess, CreatedAt: fixtureAt, FromName: "xmsg@host · anon:ops", Bytes: 21, Text: "hello codex", Envelope: "<xmsg from=\"ops\">hello codex</xmsg>"},
			{ID: msgAgy, SessionID: agyQueue, CreatedAt: fixtureAt, FromName: "xmsg@host · anon:ops", Bytes: 22, Text: "hello agy", Envelope: "<xmsg from=\"ops\">hello agy</xmsg>"},
			{ID: "01900000-0000-7000-8000-000000000006", Share: "peer:hub2", SessionID: "svc:builder", CreatedAt: fixtureAt, FromName: "xmsg@hub2 · svc:ci", Bytes: 9, Text: "build it", Envelope: "build it", Origin: json.RawMessage(`{"peer":"hub2"}`)},
		},
		idem: []Idem{
			{Principal: "http:xmsg@host · anon:ops", Key: "key-1", Body: "{\"text\":\"hello codex\"}", MessageID: msgCodex, SessionID: codexSess, FromName: "xmsg@host · anon:ops", Bytes: 21, Outcome: ledger.Queued, CreatedAt: fixtureAt},
			{Principal: "svc:ci", Key: "key-2", Body: "{\"text\":\"hello agy\"}", MessageID: msgAgy, SessionID: agySess, FromName: "svc:ci", Bytes: 22, Outcome: ledger.Queued, CreatedAt: fixtureAt},
		},
		procs: []ProcessSession{
			{Harness: "codex", Boot: "b00t0000-0000-0000-0000-000000000001", PID: 4242, Start: "123456", SessionID: codexSess, CreatedAt: fixtureAt},
			{Harness: "agy", Boot: "b00t0000-0000-0000-0000-000000000001", PID: 4343, Start: "123999", SessionID: agySess, CreatedAt: fixtureAt},
		},
		outbound: []Outbound{
			{ID: msgFed, Peer: "hub2", TargetRef: "svc:builder", Outcome: ledger.NoOutcome /* "forwarded" in the file */, CreatedAt: fixtureAt},
		},
		mailbox: []MailboxEntry{
			{ID: msgMail, Peer: "leaf1", TargetRef: "svc:leafsvc", CreatedAt: fixtureAt, FromName: "xmsg@host · anon:ops", Bytes: 10, Body: "for a leaf", Envelope: []byte(`{"v":1}`), Origin: []byte(`{"host":"host"}`)},
		},
	}
}

// write stores every row, in one transaction.
func (f fixtureRows) write(tx *Tx) error {
	for _, m := range f.messages {
		if err := tx.PutMessage(m); err != nil {
			return err
		}
	}
	for _, r := range f.replies {
		seq, err := tx.AddReply(r)
		if err != nil {
			return err
		}
		if seq != r.Seq {
			return fmt.Errorf("reply seq %d, want %d", seq, r.Seq)
		}
	}
	for _, p := range f.queue {
		if err := tx.Enqueue(p); err != nil {
			return err
		}
	}
	for _, r := range f.idem {
		if err := tx.PutIdem(r); err != nil {
			return err
		}
	}
	for _, p := range f.procs {
		if err := tx.PutProcessSession(p); err != nil {
			return err
		}
	}
	for _, o := range f.outbound {
		if err := tx.PutOutbound(o); err != nil {
			return err
		}
	}
	for _, e := range f.mailbox {
		if err := tx.PutMailbox(e); err != nil {
			return err
		}
	}
	return nil
}

// verify reads every row back through the store's API.
func (f fixtureRows) verify(t *testing.T, tx *Tx) {
	t.Helper()
	same := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %+v, want %+v", what, got, want)
		}
	}
	for _, m := range f.messages {
		got, ok, err := tx.Message(m.ID)
		if err != nil || !ok {
			t.Errorf("message %s: found %v, err %v", m.ID, ok, err)
		}
		same("message "+m.ID, got, m)
	}
	replies, err := tx.Replies(f.replies[0].MessageID, 0)
	if err != nil {
		t.Fatal(err)
	}
	same("replies", replies, f.replies)
	for _, p := range f.queue {
		got, ok, err := tx.Head(p.SessionID)
		if err != nil || !ok {
			t.Errorf("queue of %s: found %v, err %v", p.SessionID, ok, err)
		}
		same("queued "+p.ID, got, p)
	}
	for _, r := range f.idem {
		got, ok, err := tx.Idem(r.Principal, r.Key)
		if err != nil || !ok {
			t.Errorf("idempotency key %s: found %v, err %v", r.Key, ok, err)
		}
		same("idempotency key "+r.Key, got, r)
	}
	for _, p := range f.procs {
		got, ok, err := tx.ProcessSession(p.Harness, p.Boot, p.PID, p.Start)
		if err != nil || !ok {
			t.Errorf("%s process session: found %v, err %v", p.Harness, ok, err)
		}
		same(p.Harness+" process session", got, p)
	}
	for _, o := range f.outbound {
		got, ok, err := tx.Outbound(o.ID)
		if err != nil || !ok {
			t.Errorf("outbound %s: found %v, err %v", o.ID, ok, err)
		}
		same("outbound "+o.ID, got, o)
	}
	for _, e := range f.mailbox {
		got, ok, err := tx.MailboxHead(e.Peer)
		if err != nil || !ok {
			t.Errorf("mailbox of %s: found %v, err %v", e.Peer, ok, err)
		}
		same("mailbox "+e.ID, got, e)
	}
}
