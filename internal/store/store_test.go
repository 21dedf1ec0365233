package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

func open(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(path, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newID(t testing.TB) string {
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

func TestSecondOpenFailsClearly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	s := open(t, path)
	defer s.Close()
	_, err := Open(path, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second Open: got %v, want a 'locked by another process' error", err)
	}
}

func TestWritesSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	s := open(t, path)
	id := newID(t)
	err := s.Update(func(tx *Tx) error {
		if err := tx.PutMessage(Message{ID: id, CreatedAt: 10, SessionID: "svc:a"}); err != nil {
			return err
		}
		if err := tx.Enqueue(Pending{ID: id, SessionID: "svc:a", CreatedAt: 10, Text: "hi"}); err != nil {
			return err
		}
		if _, err := tx.AddReply(Reply{MessageID: id, CreatedAt: 10, Text: "r1"}); err != nil {
			return err
		}
		return tx.PutIdem(Idem{Principal: "p", Key: "k", MessageID: id, CreatedAt: 10})
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, path)
	defer s.Close()
	s.View(func(tx *Tx) error {
		if _, ok, _ := tx.Message(id); !ok {
			t.Error("message lost across reopen")
		}
		if p, ok, _ := tx.Head("svc:a"); !ok || p.Text != "hi" {
			t.Errorf("queue head = %+v, %v; want the queued message", p, ok)
		}
		if rs, _ := tx.Replies(id, 0); len(rs) != 1 || rs[0].Seq != 1 {
			t.Errorf("replies = %+v, want one with seq 1", rs)
		}
		if _, ok, _ := tx.Idem("p", "k"); !ok {
			t.Error("idempotency key lost across reopen")
		}
		return nil
	})
}

func TestFailedWriteDoesNotTakeNeighboursDown(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer s.Close()
	boom := errors.New("boom")
	var wg sync.WaitGroup
	errs := make([]error, 64)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Update(func(tx *Tx) error {
				if err := tx.PutMessage(Message{ID: fmt.Sprintf("m%03d", i)}); err != nil {
					return err
				}
				if i%7 == 0 {
					return boom // after a write: that write must not survive
				}
				return nil
			})
		}()
	}
	wg.Wait()
	s.View(func(tx *Tx) error {
		for i, err := range errs {
			_, ok, _ := tx.Message(fmt.Sprintf("m%03d", i))
			if i%7 == 0 {
				if !errors.Is(err, boom) || ok {
					t.Errorf("write %d: err=%v stored=%v; want boom and nothing stored", i, err, ok)
				}
			} else if err != nil || !ok {
				t.Errorf("write %d: err=%v stored=%v; want stored", i, err, ok)
			}
		}
		return nil
	})
}

func TestQueueFIFOLimitAndAck(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer s.Close()
	ids := make([]string, MaxQueue)
	for i := range ids {
		ids[i] = newID(t)
		if err := s.Update(func(tx *Tx) error { return tx.Enqueue(Pending{ID: ids[i], SessionID: "svc:a"}) }); err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
	}
	err := s.Update(func(tx *Tx) error { return tx.Enqueue(Pending{ID: newID(t), SessionID: "svc:a"}) })
	if !errors.Is(err, ErrQueueFull) {
		t.Fatalf("enqueue past the limit: got %v, want ErrQueueFull", err)
	}
	// Another session's queue is independent, and its ack cannot touch ours.
	if err := s.Update(func(tx *Tx) error { return tx.Enqueue(Pending{ID: "other", SessionID: "svc:b"}) }); err != nil {
		t.Fatal(err)
	}
	s.Update(func(tx *Tx) error {
		if ok, _ := tx.Ack("svc:b", ids[0]); ok {
			t.Error("svc:b acked a message of svc:a")
		}
		return nil
	})
	for i := range ids {
		var head Pending
		s.View(func(tx *Tx) error { head, _, _ = tx.Head("svc:a"); return nil })
		if head.ID != ids[i] {
			t.Fatalf("head %d = %s, want %s (FIFO)", i, head.ID, ids[i])
		}
		var acked bool
		s.Update(func(tx *Tx) (err error) { acked, err = tx.Ack("svc:a", ids[i]); return err })
		if !acked {
			t.Fatalf("ack %d reported false", i)
		}
	}
	s.View(func(tx *Tx) error {
		if n := tx.QueueLen("svc:a"); n != 0 {
			t.Errorf("queue length after acking all = %d, want 0", n)
		}
		return nil
	})
}

// TestPurgeManyPages deletes across many bbolt pages: a purge that advanced its cursor after
// a delete would skip keys and leave old rows behind.
func TestPurgeManyPages(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer s.Close()
	const n = 3000
	var keep []string
	err := s.Update(func(tx *Tx) error {
		for i := range n {
			id := newID(t)
			at := int64(100)
			if i%10 == 0 {
				at = 1000 // young
			}
			if err := tx.PutMessage(Message{ID: id, CreatedAt: at}); err != nil {
				return err
			}
			if _, err := tx.AddReply(Reply{MessageID: id, CreatedAt: at, Text: strings.Repeat("x", 50)}); err != nil {
				return err
			}
			if err := tx.PutIdem(Idem{Principal: "p", Key: fmt.Sprint(i), CreatedAt: at}); err != nil {
				return err
			}
			if err := tx.Enqueue(Pending{ID: id, SessionID: fmt.Sprintf("s%d", i%40), CreatedAt: at}); err != nil {
				return err
			}
			if at == 1000 {
				keep = append(keep, id)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var p Purged
	if err := s.Update(func(tx *Tx) (err error) { p, err = tx.Purge(500, 500); return err }); err != nil {
		t.Fatal(err)
	}
	// Messages are keyed by time-ordered ids: the purge stops at the first young one, so the
	// old ones after it stay until the next purge; the queue and idempotency scans are exact.
	if p.IdempotencyKeys != n-len(keep) || p.Queued != n-len(keep) {
		t.Errorf("purged %+v, want %d idempotency keys and queue entries", p, n-len(keep))
	}
	s.View(func(tx *Tx) error {
		for _, id := range keep {
			if _, ok, _ := tx.Message(id); !ok {
				t.Fatalf("young message %s purged", id)
			}
			if rs, _ := tx.Replies(id, 0); len(rs) != 1 {
				t.Fatalf("young reply of %s purged", id)
			}
		}
		c := tx.Counts()
		if c.IdempotencyKeys != len(keep) || c.Queued != len(keep) {
			t.Errorf("after purge: %+v, want %d idempotency keys and queued", c, len(keep))
		}
		return nil
	})
}

func TestPurgeOrderedRemovesAllOld(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer s.Close()
	err := s.Update(func(tx *Tx) error {
		for i := range 2000 {
			id := newID(t)
			if err := tx.PutMessage(Message{ID: id, CreatedAt: int64(i)}); err != nil {
				return err
			}
			if _, err := tx.AddReply(Reply{MessageID: id, CreatedAt: int64(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var p Purged
	s.Update(func(tx *Tx) (err error) { p, err = tx.Purge(1500, 0); return err })
	if p.Messages != 1500 || p.Replies != 1500 {
		t.Errorf("purged %+v, want 1500 messages and replies", p)
	}
	s.View(func(tx *Tx) error {
		if c := tx.Counts(); c.Messages != 500 || c.Replies != 500 {
			t.Errorf("left %+v, want 500 each", c)
		}
		return nil
	})
}

func TestUpdateAfterClose(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	s.Close()
	if err := s.Update(func(*Tx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Update after Close: got %v, want ErrClosed", err)
	}
}

// TestCloseDuringWrites: writers racing Close either commit (and stay committed) or get
// ErrClosed; none hangs, and Close waits for the commits in flight.
func TestCloseDuringWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	s := open(t, path)
	var wg sync.WaitGroup
	results := make([]error, 200)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = s.Update(func(tx *Tx) error { return tx.PutMessage(Message{ID: fmt.Sprintf("c%03d", i)}) })
		}()
		if i == 100 {
			go s.Close()
		}
	}
	wg.Wait()
	s.Close()
	s = open(t, path)
	defer s.Close()
	s.View(func(tx *Tx) error {
		for i, err := range results {
			_, ok, _ := tx.Message(fmt.Sprintf("c%03d", i))
			switch {
			case err == nil && !ok:
				t.Errorf("write %d answered ok but is not stored", i)
			case err != nil && !errors.Is(err, ErrClosed):
				t.Errorf("write %d: %v", i, err)
			case err != nil && ok:
				t.Errorf("write %d refused but stored", i)
			}
		}
		return nil
	})
}

// holdCommit starts a writer that leads a commit and is held inside it, running fn, until
// release: writes made meanwhile queue up behind it. lead gets the writer's result.
func holdCommit(s *Store, fn func(*Tx) error) (release func(), lead <-chan error) {
	hold, held := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- s.Update(func(tx *Tx) error {
			select {
			case <-held:
			default:
				close(held)
			}
			<-hold
			return fn(tx)
		})
	}()
	<-held
	return func() { close(hold) }, errc
}

// waitQueued waits (at most about a second) until n writes queue for the next commit.
func waitQueued(s *Store, n int) {
	for range 1000 {
		s.mu.Lock()
		queued := len(s.pending)
		s.mu.Unlock()
		if queued == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFailedWriteCostsNoCommitsOfItsOwn: a write that fails inside a shared commit is answered
// with its error and the rest of its batch still shares one commit (not one commit each).
func TestFailedWriteCostsNoCommitsOfItsOwn(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer s.Close()
	// The first writer leads and is held inside its commit while the others queue up.
	release, lead := holdCommit(s, func(tx *Tx) error { return tx.PutMessage(Message{ID: "lead"}) })
	const n = 20
	errs := make(chan error, n)
	for i := range n {
		go func() {
			errs <- s.Update(func(tx *Tx) error {
				if i == 7 {
					return errors.New("refused")
				}
				return tx.PutMessage(Message{ID: fmt.Sprint("m", i)})
			})
		}()
	}
	waitQueued(s, n)
	before := s.Commits()
	release()
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	failed := 0
	for range n {
		if err := <-errs; err != nil {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("%d writes failed, want 1", failed)
	}
	if got := s.Commits() - before; got != 2 {
		t.Errorf("%d commits for the held one and a batch with one failing write, want 2", got)
	}
	s.View(func(tx *Tx) error {
		for i := range n {
			if _, ok, _ := tx.Message(fmt.Sprint("m", i)); ok == (i == 7) {
				t.Errorf("message m%d stored = %v", i, ok)
			}
		}
		return nil
	})
}

// TestPendingID: the id is read from the start of the encoding, and anything unusual is
// decoded in full, so Ack and Queued agree with json.Unmarshal.
func TestPendingID(t *testing.T) {
	for _, id := range []string{newID(t), `we"ird\id`, "", "ünï"} {
		raw, _ := json.Marshal(Pending{ID: id, SessionID: "s", Text: strings.Repeat("x", 1000)})
		if got, err := pendingID(raw); err != nil || got != id {
			t.Errorf("pendingID(%q) = %q, %v", id, got, err)
		}
	}
	if got, err := pendingID([]byte(`{"sessionId":"s","id":"late"}`)); err != nil || got != "late" {
		t.Errorf("id not first: %q, %v", got, err)
	}
	if _, err := pendingID([]byte(`{"id":`)); err == nil {
		t.Error("truncated entry decoded")
	}
}

// TestRider: a Rider's writes ride every commit (and only commits), in its transaction, and
// learn its result; a rider with nothing to write adds nothing.
func TestRider(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer s.Close()
	var rides, dones int
	var lastErr error
	give := true
	s.SetRider(func() (func(*Tx) error, func(error)) {
		if !give {
			return nil, nil
		}
		return func(tx *Tx) error {
				rides++
				return tx.PutIdem(Idem{Principal: "rider", Key: fmt.Sprint(dones)})
			}, func(err error) {
				dones++
				lastErr = err
			}
	})
	if err := s.Update(func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if rides != 1 || dones != 1 || lastErr != nil {
		t.Fatalf("after one commit: %d rides, %d dones (%v), want 1, 1", rides, dones, lastErr)
	}
	s.View(func(tx *Tx) error {
		if _, ok, _ := tx.Idem("rider", "0"); !ok {
			t.Error("the rider's write was not committed")
		}
		return nil
	})
	s.View(func(*Tx) error { return nil })
	give = false
	if err := s.Update(func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if dones != 1 {
		t.Fatalf("a read or an empty rider added a ride: %d dones", dones)
	}
}

// TestUpdateWritten: written runs once per write, after its function's last run and before the
// commit is visible, never for a write that failed; a batch whose other write fails runs the
// good one's function again but its written once. Mutants tried: written called inside each
// run of fn (called twice: red); called for the failed write too (red).
func TestUpdateWritten(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer s.Close()
	release, lead := holdCommit(s, func(*Tx) error { return nil })
	var mu sync.Mutex
	runs, written := 0, map[string]int{}
	visible := map[string]bool{}
	write := func(id string, fail bool) chan error {
		errc := make(chan error, 1)
		go func() {
			errc <- s.UpdateWritten(func(tx *Tx) error {
				if fail {
					return errors.New("refused")
				}
				mu.Lock()
				runs++
				mu.Unlock()
				return tx.PutMessage(Message{ID: id})
			}, func() {
				// Another reader sees the last commit, not this one's writes.
				seen := make(chan bool)
				go s.View(func(tx *Tx) error { _, ok, _ := tx.Message(id); seen <- ok; return nil })
				ok := <-seen
				mu.Lock()
				written[id]++
				visible[id] = ok
				mu.Unlock()
			})
		}()
		return errc
	}
	good := write("good", false)
	waitQueued(s, 1)
	bad := write("bad", true)
	waitQueued(s, 2)
	release()
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	if err := <-good; err != nil {
		t.Fatal(err)
	}
	if err := <-bad; err == nil {
		t.Fatal("the failing write succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 2 || written["good"] != 1 || written["bad"] != 0 || visible["good"] {
		t.Errorf("fn ran %d times (want 2: the batch again without the failed write), written %v (want good once), visible in written %v (want not)", runs, written, visible)
	}
	var stored bool
	s.View(func(tx *Tx) error { _, stored, _ = tx.Message("good"); return nil })
	if !stored {
		t.Error("the write is not committed")
	}
}

// TestUnqueueID: an ack's delete removes the row under its key only if that row is its
// message's: a key given again after a failed transaction holds another row, which stays.
// Mutant tried: UnqueueID deleting whatever is under the key (the other row is gone: red).
func TestUnqueueID(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer s.Close()
	var key []byte
	if err := s.Update(func(tx *Tx) (err error) {
		key, err = tx.EnqueueShare(Pending{ID: "m2", SessionID: "svc:bot", Text: "x"}, MaxStored, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	queued := func(id string) (ok bool) {
		s.View(func(tx *Tx) error { ok, _ = tx.Queued("svc:bot", id); return nil })
		return ok
	}
	if err := s.Update(func(tx *Tx) error { return tx.UnqueueID(key, "m1") }); err != nil {
		t.Fatal(err)
	}
	if !queued("m2") {
		t.Fatal("an ack of m1 deleted m2, which holds the same key")
	}
	if err := s.Update(func(tx *Tx) error { return tx.UnqueueID(key, "m2") }); err != nil {
		t.Fatal(err)
	}
	if queued("m2") {
		t.Fatal("m2's own ack left it queued")
	}
}

// TestQuiet: the store is quiet only when no write commits and none waits for a commit.
func TestQuiet(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer s.Close()
	if !s.Quiet() {
		t.Fatal("a new store is not quiet")
	}
	hold, lead := holdCommit(s, func(tx *Tx) error { return tx.PutMessage(Message{ID: "lead"}) })
	var once sync.Once
	release := func() { once.Do(hold) }
	defer release() // a failure below must not leave Close waiting for the held commit
	if s.Quiet() {
		t.Fatal("quiet while a write commits")
	}
	queued := make(chan error, 1)
	go func() { queued <- s.Update(func(tx *Tx) error { return tx.PutMessage(Message{ID: "queued"}) }) }()
	waitQueued(s, 1)
	release()
	for _, c := range []<-chan error{lead, queued} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if !s.Quiet() {
		t.Fatal("not quiet once every write is committed")
	}
}
