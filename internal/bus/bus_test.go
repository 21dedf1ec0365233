package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

// newBus builds a bus on a real store, with a Claude session dir holding one live session
// (this test process) and one dead one.
func newBus(t testing.TB) (*Bus, string) {
	t.Helper()
	return newBusWith(t, nil)
}

// newBusWith is newBus with tweak applied to its Config before New (the ack flusher reads
// AckDelay when it starts: setting it afterwards races).
func newBusWith(t testing.TB, tweak func(*Config)) (*Bus, string) {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(filepath.Join(dir, "x.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sessions := filepath.Join(dir, "s")
	os.Mkdir(sessions, 0o700)
	start, _ := peercred.Proc{}.StartTime(os.Getpid())
	write := func(name string, f map[string]any) {
		raw, _ := json.Marshal(f)
		os.WriteFile(filepath.Join(sessions, name), raw, 0o600)
	}
	write("live.json", map[string]any{"pid": os.Getpid(), "sessionId": "11111111-aaaa-bbbb-cccc-000000000001", "name": "alice", "cwd": "/p", "status": "idle", "procStart": start, "messagingSocketPath": filepath.Join(dir, "nobody.sock")})
	// A dead session: pid 1 with a start time that is not init's.
	write("dead.json", map[string]any{"pid": 1, "sessionId": "11111111-aaaa-bbbb-cccc-000000000002", "name": "bob", "cwd": "/", "status": "idle", "procStart": "1", "messagingSocketPath": "/nonexistent"})
	cfg := Config{Host: "h", MaxBody: 100, ReplyTTL: time.Hour, IdemTTL: time.Hour, Store: st, Proc: peercred.Proc{}, Log: log,
		SvcExe: map[string]string{"known": "/bin/true"},
		Claude: &claude.Scanner{Dirs: []string{sessions}, Proc: peercred.Proc{}, UID: os.Geteuid(), Log: log}}
	if tweak != nil {
		tweak(&cfg)
	}
	b := New(cfg)
	t.Cleanup(b.Close)
	return b, dir
}

func TestResolve(t *testing.T) {
	b, _ := newBus(t)
	cases := []struct {
		ref, wantID, wantCode string
	}{
		{"11111111-aaaa-bbbb-cccc-000000000001", "11111111-aaaa-bbbb-cccc-000000000001", ""},
		{"CLAUDE:11111111-AAAA-bbbb-cccc-000000000001", "11111111-aaaa-bbbb-cccc-000000000001", ""},
		{"alice", "11111111-aaaa-bbbb-cccc-000000000001", ""},
		{"Alice", "", "not_found"},     // names match exactly
		{"bob", "", "unregistered"},    // dead entry whose pid (1) is alive now: a recycled pid
		{"svc:known", "svc:known", ""}, // configured service: queues while it reconnects
		{"svc:unknown", "", "not_found"},
		{"", "", "not_found"},
		{"999999999", "", "not_found"},
	}
	for _, c := range cases {
		got, err := b.Resolve(c.ref)
		code := ""
		if err != nil {
			code = AsError(err).Code.String()
		}
		if code != c.wantCode || (c.wantCode == "" && got.SessionID != c.wantID) {
			t.Errorf("Resolve(%q) = %q, %v; want %q, %q", c.ref, got.SessionID, err, c.wantID, c.wantCode)
		}
	}
}

func TestSendRefusalsChangeNothing(t *testing.T) {
	b, _ := newBus(t)
	ctx := context.Background()
	for _, s := range []Send{
		{To: envelope.ParseRef("alice"), Text: ""},
		{To: envelope.ParseRef("alice"), Text: strings.Repeat("x", 101)},
		{To: envelope.ParseRef("alice"), Text: "x", Key: "bad\x00key"},
		{To: envelope.ParseRef("x@elsewhere"), Text: "x"},
		{To: envelope.ParseRef("nobody"), Text: "x"},
		{To: envelope.ParseRef("alice"), Text: "x"}, // the inbox socket does not exist: 502
	} {
		if _, err := b.Send(ctx, s); err == nil {
			t.Errorf("Send(%+v) succeeded", s)
		}
	}
	c, _ := b.Counts()
	// The failed delivery left a message marked delivery_failed; nothing else was stored.
	if c.Queued != 0 || c.IdempotencyKeys != 0 || c.Replies != 0 || c.Messages > 1 {
		t.Errorf("after refusals: %+v", c)
	}
}

// FuzzResolve: any ref resolves or is refused with a protocol error; never a panic, never an
// internal error.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"alice", "claude:", "session:claude:x", "svc:", "svc:known", "pi:", "1", "-1", "0", "x@h", "@", "11111111-aaaa-bbbb-cccc-000000000001~2", "\x00", "ALICE"} {
		f.Add(s)
	}
	b, _ := newBus(f)
	f.Fuzz(func(t *testing.T, ref string) {
		_, err := b.Resolve(ref)
		if err != nil && AsError(err).Code == ledger.Internal {
			t.Fatalf("Resolve(%q): internal error %v", ref, err)
		}
	})
}

// TestLongPollWaitersAndWakeup: waiters beyond MaxWaiters get 503 at once; a reply wakes
// every waiter of its message.
func TestLongPollWaitersAndWakeup(t *testing.T) {
	b, _ := newBus(t)
	b.waiters = make(chan struct{}, 2) // as if MaxWaiters were 2
	id := "01890000-0000-7000-8000-000000000001"
	err := b.cfg.Store.Update(func(tx *store.Tx) error {
		return tx.PutMessage(store.Message{ID: id, SessionID: "svc:known", RecipientHarness: "svc", CreatedAt: b.nowUnix()})
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	results := make(chan []Reply, 2)
	for range 2 {
		go func() {
			rs, err := b.Replies(ctx, id, 0, MaxWait)
			if err != nil {
				t.Error(err)
			}
			results <- rs
		}()
	}
	// Wait until both hold a permit, then the third is refused.
	for len(b.waiters) < 2 {
		time.Sleep(time.Millisecond)
	}
	if _, err := b.Replies(ctx, id, 0, time.Second); AsError(err).Code != ledger.ServiceUnavailable {
		t.Fatalf("third waiter: got %v, want 503", err)
	}
	// A zero wait never needs a permit.
	if rs, err := b.Replies(ctx, id, 0, 0); err != nil || len(rs) != 0 {
		t.Fatalf("wait=0: %v, %v", rs, err)
	}
	caller := Caller{Harness: "svc", SessionID: "svc:known", Name: "known"}
	if _, err := b.Reply(ctx, caller, id, "pong"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if rs := <-results; len(rs) != 1 || rs[0].Text != "pong" {
			t.Errorf("woken waiter got %+v", rs)
		}
	}
	if len(b.waiters) != 0 {
		t.Errorf("%d permits still held", len(b.waiters))
	}
}

// TestHarnessPrefixPinsResolution: a session that names itself "svc:known" must not capture
// messages addressed to the service svc:known (review finding: prefix confusion).
func TestHarnessPrefixPinsResolution(t *testing.T) {
	b, _ := newBus(t)
	me := peercred.Cred{PID: os.Getpid(), UID: uint32(os.Geteuid())}
	impostor, err := b.RegisterSession("pi", "svc:known", "/", me, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"svc:known", "SVC:Known"} {
		got, err := b.Resolve(ref)
		if err != nil || got.Harness != "svc" || got.SessionID != "svc:known" || !got.Offline {
			t.Errorf("Resolve(%q) = %+v, %v; want the (offline) service svc:known", ref, got, err)
		}
	}
	// The impostor is still reachable by its own id, and "pi:" pins to pi.
	if got, err := b.Resolve(impostor.SessionID); err != nil || got.SessionID != impostor.SessionID {
		t.Errorf("Resolve(own id) = %+v, %v", got, err)
	}
	if _, err := b.Resolve("pi:alice"); AsError(err).Code != ledger.NotFound {
		t.Errorf("pi:alice resolved to a claude session: %v", err)
	}
}

// TestReplyPushToClaude: a reply to a message from a Claude session is pushed to its inbox
// only after the reply and the pushed message are committed (the session may answer the
// push at once); an unreachable inbox is recorded as sender_gone, with no pushed row.
func TestReplyPushToClaude(t *testing.T) {
	b, dir := newBus(t)
	ctx := context.Background()
	alice := "11111111-aaaa-bbbb-cccc-000000000001"
	put := func(id string) {
		err := b.cfg.Store.Update(func(tx *store.Tx) error {
			return tx.PutMessage(store.Message{ID: id, SessionID: "svc:known", RecipientHarness: "svc", ReturnHarness: "claude",
				ReturnSessionID: alice, PushReplies: true, ThreadID: id, CreatedAt: b.nowUnix()})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	svc := Caller{Harness: "svc", SessionID: "svc:known", Name: "known"}

	put("01890000-0000-7000-8000-0000000000a1")
	res, err := b.Reply(ctx, svc, "01890000-0000-7000-8000-0000000000a1", "no inbox")
	if err != nil || res.PushOutcome.String() != "sender_gone" || res.PushedMessageID != "" {
		t.Fatalf("reply to a gone inbox = %+v, %v; want sender_gone and no pushed id", res, err)
	}
	if c, _ := b.Counts(); c.Messages != 1 {
		t.Errorf("%d messages stored, want only the original (no pushed row)", c.Messages)
	}
	m, _ := b.Message("01890000-0000-7000-8000-0000000000a1")
	if len(m.Replies) != 1 || m.Replies[0].PushOutcome.String() != "sender_gone" {
		t.Errorf("stored reply = %+v", m.Replies)
	}

	l, err := net.Listen("unix", filepath.Join(dir, "nobody.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	seen := make(chan bool, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		line, _ := io.ReadAll(c)
		c.Close()
		id := regexp.MustCompile(`message_id=([0-9a-f-]{36});`).FindSubmatch(line)
		_, err = b.Message(string(id[1]))
		seen <- err == nil // the pushed message was already stored when the line arrived
	}()
	put("01890000-0000-7000-8000-0000000000a2")
	res, err = b.Reply(ctx, svc, "01890000-0000-7000-8000-0000000000a2", "hello")
	if err != nil || res.PushOutcome.String() != "pushed" || res.PushedMessageID == "" {
		t.Fatalf("reply = %+v, %v; want pushed", res, err)
	}
	if !<-seen {
		t.Error("the push reached the inbox before its message was committed")
	}
}

// TestAsErrorRetryable: a full disk and running out of descriptors are told apart from an
// internal error, also when bbolt has flattened the errno to text.
func TestAsErrorRetryable(t *testing.T) {
	cases := []struct {
		err  error
		code string
	}{
		{&os.PathError{Op: "write", Path: "x.db", Err: syscall.ENOSPC}, "insufficient_storage"},
		{fmt.Errorf("store: %w", syscall.EDQUOT), "insufficient_storage"},
		{errors.New("file resize error: " + syscall.ENOSPC.Error()), "insufficient_storage"},
		{&os.PathError{Op: "open", Path: "dir", Err: syscall.EMFILE}, "service_unavailable"},
		{errors.New("boom"), "internal"},
	}
	for _, c := range cases {
		if e := AsError(c.err); e.Code.String() != c.code {
			t.Errorf("AsError(%v) = %s, want %s", c.err, e.Code, c.code)
		}
	}
}
