package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/records"
	"github.com/xmsg/xmsg/internal/store"
)

// mail is every row of peer's mailbox, oldest first.
func mail(tx *store.Tx, peer string) ([]store.MailboxEntry, error) {
	var rows []store.MailboxEntry
	err := tx.MailboxScan(peer, func(_, v []byte) (bool, error) {
		e, err := store.DecodeMailbox(v)
		rows = append(rows, e)
		return err == nil, err
	})
	return rows, err
}

// encoderRow is what an Encoder with HTML escaping off writes for r, without its newline:
// the bytes EncodeRow must write.
func encoderRow(r Row) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

func TestEncodeRowIsEncoder(t *testing.T) {
	odd := "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀"
	for _, r := range []Row{
		{},
		{ID: "id", Origin: json.RawMessage(`{"kind":"fed","host":"hub"}`), Body: "hi", To: "svc:x", CreatedAt: 7},
		{ID: odd, Origin: json.RawMessage(" { \"k\" : [1, \"<\u2028>\"] } "), Body: odd, To: odd, Principal: json.RawMessage(`{"harness":"claude","name":"<a>"}`),
			PushReplies: true, ThreadID: odd, CreatedAt: -1 << 60},
	} {
		want, err := encoderRow(r)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := EncodeRow(r); err != nil || !bytes.Equal(got, want) {
			t.Errorf("EncodeRow = %s, %v, want %s", got, err, want)
		}
	}
	if _, err := EncodeRow(Row{Origin: json.RawMessage(`{"kind":`)}); err == nil {
		t.Error("EncodeRow took an origin that is not JSON")
	}
	// An empty origin that is not nil is null, as a nil one (an Encoder refuses it).
	if got, err := EncodeRow(Row{Origin: json.RawMessage{}}); err != nil || !bytes.Contains(got, []byte(`"origin":null,`)) {
		t.Errorf("EncodeRow of an empty origin = %s, %v", got, err)
	}
}

func FuzzEncodeRow(f *testing.F) {
	f.Add("id", []byte(`{"kind":"fed"}`), "body<&>", "svc:x", []byte(`{"name":"a"}`), true, "t", int64(1))
	f.Add("\xff", []byte(" [1, \"\u2029<\" ] "), "\x00\"\\", "", []byte{}, false, "", int64(-1))
	f.Fuzz(func(t *testing.T, id string, origin []byte, body, to string, principal []byte, push bool, thread string, at int64) {
		if len(origin) == 0 {
			// No origin is null to both. An empty one that is not nil, which no decoded row
			// has, an Encoder refuses (RawMessage's MarshalJSON gives it no bytes); EncodeRow
			// writes null for it as for nil.
			origin = nil
		}
		r := Row{ID: id, Origin: origin, Body: body, To: to, Principal: principal, PushReplies: push, ThreadID: thread, CreatedAt: at}
		want, werr := encoderRow(r)
		got, err := EncodeRow(r)
		if (werr == nil) != (err == nil) {
			t.Fatalf("EncodeRow err = %v, Encoder err = %v", err, werr)
		}
		if err == nil && !bytes.Equal(got, want) {
			t.Errorf("EncodeRow = %q, want %q", got, want)
		}
	})
}

// wireOf is what Pull must hand out for peer's mail: each row read from the store, as RowOf
// makes it and EncodeRow writes it.
func wireOf(t *testing.T, m *Mailboxes, peer string) map[string]string {
	t.Helper()
	out := map[string]string{}
	m.store.View(func(tx *store.Tx) error {
		rows, err := mail(tx, peer)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range rows {
			w, err := EncodeRow(RowOf(e))
			if err != nil {
				t.Fatal(err)
			}
			out[e.ID] = string(w)
		}
		return nil
	})
	return out
}

// settled waits until peer has no row settling: its acks' commit is made and what follows it
// (the wire rows dropped) done. Bounded: a settle's commit rides at most settleRide.
func settled(t *testing.T, m *Mailboxes, peer string) {
	t.Helper()
	committed(t, m)
	for range 2000 {
		m.mu.Lock()
		n := len(m.settling[peer])
		m.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("acks never settled")
}

func wireLen(m *Mailboxes, peer string) (rows, bytes int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.wire[peer]), m.wireBytes
}

// TestPullIsTheStoredRow: a pull hands out each row as it is stored, whether its wire row was
// kept when it was put or not (a restarted hub, a full cache); a settled row's wire row is
// forgotten. Mutants tried: Put keeping nothing: the cache test red (rows 0); settle not
// dropping the wire rows: red; EncodeRow escaping HTML: TestEncodeRowIsEncoder red.
func TestPullIsTheStoredRow(t *testing.T) {
	m := open(t, 0)
	ids := putN(t, m, "l1", 3)
	if n, _ := wireLen(m, "l1"); n != 3 {
		t.Fatalf("%d wire rows kept for 3 puts, want 3", n)
	}
	want := wireOf(t, m, "l1")
	check := func(stream string) {
		t.Helper()
		rows, err := m.Pull(context.Background(), "l1", stream, 0, 10, 0)
		if err != nil || len(rows) != 3 {
			t.Fatalf("pull = %d rows %v, want 3", len(rows), err)
		}
		for i, r := range rows {
			if r.ID != ids[i] || string(r.JSON) != want[r.ID] {
				t.Fatalf("row %d = %s %s, want %s %s", i, r.ID, r.JSON, ids[i], want[ids[i]])
			}
		}
	}
	check("a")
	// As after a restart: nothing kept; the rows are read from the store, and kept again.
	m.mu.Lock()
	m.wire, m.wireBytes = nil, 0
	m.mu.Unlock()
	check("b")
	if n, _ := wireLen(m, "l1"); n != 3 {
		t.Fatalf("%d wire rows kept after a pull from the store, want 3", n)
	}
	if n, err := m.Ack("l1", ids); n != 3 || err != nil {
		t.Fatalf("ack = %d %v", n, err)
	}
	settled(t, m, "l1")
	if n, b := wireLen(m, "l1"); n != 0 || b != 0 {
		t.Fatalf("after the acks: %d wire rows, %d bytes kept; want none", n, b)
	}
}

// TestWireBound: the wire rows one leaf's mailbox keeps are bounded by its mailbox's bound,
// and those of rows removed without a settle (retention) are pruned by the next pull once it
// is reached. Mutant tried: pruneWire doing nothing: the stale rows stay, red.
func TestWireBound(t *testing.T) {
	m := open(t, 3)
	putN(t, m, "l1", 3)
	if err := m.store.Update(func(tx *store.Tx) error {
		rows, err := mail(tx, "l1")
		for _, r := range rows {
			if _, err := records.Taken(tx, "l1", r.ID, ledger.Expired); err != nil {
				return err
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	id, err := put(t, m, "l1")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := wireLen(m, "l1"); n != 3 {
		t.Fatalf("%d wire rows at the bound of 3, want 3 (the new row not kept)", n)
	}
	rows, err := m.Pull(context.Background(), "l1", "", 0, 10, 0)
	if err != nil || len(rows) != 1 || rows[0].ID != id {
		t.Fatalf("pull = %v %v, want the new row", rows, err)
	}
	if n, _ := wireLen(m, "l1"); n != 1 {
		t.Fatalf("%d wire rows after the pull, want 1 (the stale ones pruned, the new one kept)", n)
	}
}

// rowOfReflect is RowOf as it was, all by encoding/json: what RowOf's pass of its own must
// give for every envelope this daemon writes.
func rowOfReflect(e store.MailboxEntry) Row {
	r := Row{ID: e.ID, Origin: e.Origin, Body: e.Body, To: e.TargetRef, CreatedAt: e.CreatedAt}
	var env struct {
		Principal json.RawMessage `json:"principal"`
		Push      bool            `json:"push_replies"`
		ThreadID  string          `json:"thread_id"`
	}
	if json.Unmarshal(e.Envelope, &env) == nil {
		r.Principal, r.PushReplies, r.ThreadID = env.Principal, env.Push, env.ThreadID
	}
	return r
}

func TestRowOfIsReflect(t *testing.T) {
	for _, env := range []string{
		`{"v":2,"id":"x","principal":{"harness":"claude","name":"a<&>"},"to":{"ref":"svc:x"},"body":"b","push_replies":true,"thread_id":"t","created_at":1}`,
		`{"v":2,"id":"x","principal":{"harness":"svc","name":"m"},"to":{"ref":"x"},"body":"","push_replies":false,"thread_id":"","created_at":1}`,
		`{"v":2,"principal":{"a":[1,{"b":null}]},"push_replies":false,"thread_id":"t\u00e9\n\"q\""}`,
		`{"principal":{},"push_replies":true}`,
		`{"principal":null,"push_replies":true,"thread_id":"t"}`,
		`{"principal":{"a":1},"push_replies":"yes","thread_id":"t"}`,
		`{"principal":{"a":1},"push_replies":true,"thread_id":7}`,
		`{"principal":{"a":1},"push_replies":true,"thread_id":null}`,
		`{"principal":{"a":1}`,
		``,
		`[]`,
	} {
		e := store.MailboxEntry{ID: "id", Body: "b", TargetRef: "svc:x", CreatedAt: 5, Origin: []byte(`{"kind":"fed"}`), Envelope: []byte(env)}
		got, want := RowOf(e), rowOfReflect(e)
		gw, err1 := EncodeRow(got)
		ww, err2 := EncodeRow(want)
		if err1 != nil || err2 != nil || !bytes.Equal(gw, ww) {
			t.Errorf("envelope %s: RowOf = %s (%v), want %s (%v)", env, gw, err1, ww, err2)
		}
	}
}
