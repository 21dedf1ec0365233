package store

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/xmsg/xmsg/internal/ledger"
)

// rawPut stores row under id in bucket as it is, for rows this package would not write.
func rawPut(t testing.TB, st *Store, bucket []byte, id string, row []byte) {
	t.Helper()
	if err := st.Update(func(tx *Tx) error { return tx.btx.Bucket(bucket).Put([]byte(id), row) }); err != nil {
		t.Fatal(err)
	}
}

func rawGet(t testing.TB, st *Store, bucket []byte, id string) []byte {
	t.Helper()
	var row []byte
	if err := st.View(func(tx *Tx) error {
		row = bytes.Clone(tx.btx.Bucket(bucket).Get([]byte(id)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return row
}

// reencoded is what SetMessageOutcome must leave of row, as the decode, the change and an
// encode leave it: the message it reads as, and whether it changes.
func reencoded(row []byte, now ledger.Outcome, when func(ledger.Outcome) bool) (Message, bool) {
	var m Message
	if json.Unmarshal(row, &m) != nil || !when(m.Outcome) {
		return m, false
	}
	m.Outcome = now
	var read Message // as the encode writes it: a word it does not know is written empty
	return read, json.Unmarshal(appendMessage(nil, m), &read) == nil
}

// The rows this package writes come out of an outcome's change as the send would have written
// them with that outcome, byte for byte: every field, each optional one present and absent,
// escapes, a word the decode does not know, and the condition either way. A row holding a
// brace or a bracket in a string goes to the decode and reads the same.
func TestSetOutcomeIsReencode(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "x.db"))
	odd := "a\"b\\c\b\f\n\r\t\x00\x1f<>&\u2028\u2029\xff\xfeé😀,\"outcome\":\"delivered\""
	msgs := []Message{
		{ID: "019a-x", CreatedAt: 3, SessionID: "s", FromName: "f", Bytes: 200, Outcome: ledger.Queued, RecipientHarness: "claude", ThreadID: "t"},
		{ID: "odd", CreatedAt: 1 << 62, SessionID: odd, FromName: odd, Bytes: -1, Outcome: ledger.Delivered, RecipientHarness: odd,
			ReturnHarness: odd, ReturnSessionID: odd, ReturnHost: odd, PushReplies: true, ThreadID: odd, Report: odd},
		{ID: "braces", FromName: "{x}", Outcome: ledger.Queued, ThreadID: odd},
		{ID: "unknown word", Outcome: ledger.Outcome(200)},
		{ID: "report", Outcome: ledger.Queued, Report: "written", ReturnHost: "h"},
	}
	for _, m := range msgs {
		for _, now := range []ledger.Outcome{ledger.Delivered, ledger.Expired, ledger.NoOutcome} {
			for _, want := range []bool{true, false} {
				if err := st.Update(func(tx *Tx) error { return tx.PutMessage(m) }); err != nil {
					t.Fatal(err)
				}
				row := rawGet(t, st, bucketMessages, m.ID)
				var was Message
				if err := json.Unmarshal(row, &was); err != nil {
					t.Fatal(err)
				}
				when := func(cur ledger.Outcome) bool {
					if cur != was.Outcome {
						t.Errorf("%q: condition asked of %v, the row reads %v", m.ID, cur, was.Outcome)
					}
					return want
				}
				var found, changed bool
				err := st.Update(func(tx *Tx) (err error) {
					found, changed, err = tx.SetMessageOutcome(m.ID, now, when)
					return err
				})
				if err != nil || !found || changed != want {
					t.Fatalf("%q -> %v: found %v, changed %v, %v; want changed %v", m.ID, now, found, changed, err, want)
				}
				got := rawGet(t, st, bucketMessages, m.ID)
				if !want {
					if !bytes.Equal(got, row) {
						t.Errorf("%q: a row left as it was changed: %s", m.ID, got)
					}
					continue
				}
				w := m
				w.Outcome = now
				if wantRow := appendMessage(nil, w); flat(row) && !bytes.Equal(got, wantRow) {
					t.Errorf("%q -> %v: row %s, want %s", m.ID, now, got, wantRow)
				}
				var read Message
				if wantRead, _ := reencoded(row, now, when); json.Unmarshal(got, &read) != nil || read != wantRead {
					t.Errorf("%q -> %v: reads %+v, want %+v", m.ID, now, read, wantRead)
				}
			}
		}
	}
	if err := st.Update(func(tx *Tx) error {
		found, changed, err := tx.SetMessageOutcome("none", ledger.Expired, func(ledger.Outcome) bool { return true })
		if found || changed || err != nil {
			t.Errorf("a missing message: found %v, changed %v, %v", found, changed, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A row not in the shape this package writes is read as the decode reads it: a key given
// twice (the decode takes the last), an escaped word, an outcome only in a nested object, a
// row the decode refuses.
func TestSetOutcomeOddRows(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "x.db"))
	for _, c := range []struct {
		name string
		row  string
	}{
		{"twice", `{"id":"x","outcome":"queued","outcome":"delivered"}`},
		{"escaped", `{"id":"x","outcome":"\u0071ueued"}`},
		{"nested", `{"id":"x","more":{"a":1,"outcome":"queued"}}`},
		{"nested in a list", `{"id":"x","more":[{"a":1,"outcome":"queued"}]}`},
		{"not a string", `{"id":"x","outcome":null,"b":"{"}`},
		{"spaced", `{"id":"x", "outcome" : "queued"}`},
	} {
		rawPut(t, st, bucketMessages, c.name, []byte(c.row))
		wantM, wantChanged := reencoded([]byte(c.row), ledger.Delivered, func(cur ledger.Outcome) bool { return cur == ledger.Queued })
		var changed bool
		if err := st.Update(func(tx *Tx) (err error) {
			_, changed, err = tx.SetMessageOutcome(c.name, ledger.Delivered, func(cur ledger.Outcome) bool { return cur == ledger.Queued })
			return err
		}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var got Message
		if err := json.Unmarshal(rawGet(t, st, bucketMessages, c.name), &got); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if changed != wantChanged || got.Outcome != wantM.Outcome {
			t.Errorf("%s: changed %v, reads %v; the decode: changed %v, reads %v", c.name, changed, got.Outcome, wantChanged, wantM.Outcome)
		}
	}
	rawPut(t, st, bucketMessages, "damaged", []byte(`{"id":"x","outcome":`))
	if err := st.Update(func(tx *Tx) error {
		_, _, err := tx.SetMessageOutcome("damaged", ledger.Delivered, func(ledger.Outcome) bool { return true })
		return err
	}); err == nil {
		t.Error("a row the decode refuses was changed without an error")
	}
}

// An outbound row changes only where it is the named peer's, to json.Marshal's bytes of the
// changed row, a peer's name that must be escaped included.
func TestSetOutboundOutcome(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "x.db"))
	for _, peer := range []string{"leaf-1", "a<b", "q\"uote", "\xff", "hub,\"peer\":\"x"} {
		o := Outbound{ID: "m-" + peer, Peer: peer, TargetRef: "svc:x", Outcome: ledger.Queued, CreatedAt: 9}
		for _, asked := range []string{peer + "x", peer} {
			if err := st.Update(func(tx *Tx) error { return tx.PutOutbound(o) }); err != nil {
				t.Fatal(err)
			}
			var mine bool
			if err := st.Update(func(tx *Tx) (err error) {
				mine, err = tx.SetOutboundOutcome(o.ID, asked, ledger.Expired)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			// As the decode reads the row: a name json.Marshal could not write as it is
			// (not UTF-8) is not the name asked.
			stored, _ := json.Marshal(o)
			var w Outbound
			if err := json.Unmarshal(stored, &w); err != nil {
				t.Fatal(err)
			}
			isMine := w.Peer == asked
			want := stored
			if isMine {
				w.Outcome = ledger.Expired
				want, _ = json.Marshal(w)
			}
			if got := rawGet(t, st, bucketOutbound, o.ID); mine != isMine || !bytes.Equal(got, want) {
				t.Errorf("peer %q asked as %q: mine %v, row %s, want %s", peer, asked, mine, got, want)
			}
		}
	}
	if err := st.Update(func(tx *Tx) error {
		if mine, err := tx.SetOutboundOutcome("none", "leaf-1", ledger.Expired); mine || err != nil {
			t.Errorf("a missing row: %v, %v", mine, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Any row the decode reads comes out of an outcome's change reading as the decode, the change
// and the encode leave it, and changed when they change it.
func FuzzSetOutcome(f *testing.F) {
	f.Add([]byte(`{"id":"x","outcome":"queued"}`), uint8(ledger.Delivered), uint8(ledger.Queued))
	f.Add(appendMessage(nil, Message{ID: "y", FromName: "<&>", Outcome: ledger.Delivered, Report: "written"}), uint8(ledger.Expired), uint8(ledger.Delivered))
	f.Add([]byte(`{"outcome":"delivered","id":"x","outcome":"queued"}`), uint8(ledger.Expired), uint8(ledger.Queued))
	f.Add([]byte(`{"id":"x","more":{"a":1,"outcome":"queued"}}`), uint8(ledger.Expired), uint8(ledger.NoOutcome))
	f.Fuzz(func(t *testing.T, row []byte, now, was uint8) {
		var m Message
		if json.Unmarshal(row, &m) != nil {
			return
		}
		when := func(cur ledger.Outcome) bool { return cur == ledger.Outcome(was) }
		wantM, wantChanged := reencoded(row, ledger.Outcome(now), when)
		st := open(t, filepath.Join(t.TempDir(), "x.db"))
		rawPut(t, st, bucketMessages, "k", row)
		var changed bool
		if err := st.Update(func(tx *Tx) (err error) {
			_, changed, err = tx.SetMessageOutcome("k", ledger.Outcome(now), when)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		var got Message
		if err := json.Unmarshal(rawGet(t, st, bucketMessages, "k"), &got); err != nil {
			t.Fatalf("the changed row %q does not decode: %v", rawGet(t, st, bucketMessages, "k"), err)
		}
		if changed != wantChanged || !reflect.DeepEqual(got, wantM) && wantChanged {
			t.Errorf("changed %v, reads %+v; the decode: changed %v, reads %+v", changed, got, wantChanged, wantM)
		}
		if !wantChanged && !bytes.Equal(rawGet(t, st, bucketMessages, "k"), row) {
			t.Errorf("a row left as it was changed: %q, was %q", rawGet(t, st, bucketMessages, "k"), row)
		}
	})
}

// The change in place against the decode and encode it replaces (a row with a brace in a
// string takes the decode): one message row's outcome, set and set back, in one transaction.
func BenchmarkSetOutcome(b *testing.B) {
	for _, c := range []struct{ name, from string }{{"in place", "alice"}, {"decoded", "{alice}"}} {
		b.Run(c.name, func(b *testing.B) {
			st := open(b, filepath.Join(b.TempDir(), "x.db"))
			m := Message{ID: "019a0000-0000-7000-8000-000000000000", CreatedAt: 1, SessionID: "svc:x", FromName: c.from, Bytes: 200,
				Outcome: ledger.Queued, RecipientHarness: "service", ThreadID: "019a0000-0000-7000-8000-000000000001"}
			if err := st.Update(func(tx *Tx) error { return tx.PutMessage(m) }); err != nil {
				b.Fatal(err)
			}
			always := func(ledger.Outcome) bool { return true }
			if err := st.Update(func(tx *Tx) error {
				b.ResetTimer()
				for i := range b.N {
					if _, _, err := tx.SetMessageOutcome(m.ID, ledger.Outcome(1+i%2), always); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		})
	}
}
