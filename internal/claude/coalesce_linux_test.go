//go:build linux

package claude

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// countingWatcher is inotify that counts drains and can stop inside one, so that a test can
// act while a refresh is under way.
type countingWatcher struct {
	watcher
	drains atomic.Int64
	// hold, when set, makes the next drain signal in and then wait for out, after it read
	// the queue: whatever the test does meanwhile happens after the refresh started, and is
	// not seen by it.
	hold    atomic.Bool
	in, out chan struct{}
}

func (w *countingWatcher) drain(fn func(int, event, string)) error {
	w.drains.Add(1)
	err := w.watcher.drain(fn)
	if w.hold.CompareAndSwap(true, false) {
		w.in <- struct{}{}
		<-w.out
	}
	return err
}

// watchedScanner is a Scanner of a new directory whose watcher counts its drains, with the
// watch already set up by a first lookup (so later drains are the ones a test counts).
func watchedScanner(t *testing.T) (*countingWatcher, string, *Scanner) {
	t.Helper()
	w := withCountingWatcher(t)
	dir := t.TempDir()
	s, _ := newScanner(t, dir)
	t.Cleanup(s.Close)
	lookup(t, s, "x", 0)
	return w, dir, s
}

func withCountingWatcher(t *testing.T) *countingWatcher {
	t.Helper()
	real, err := newWatcher()
	if err != nil {
		t.Fatal(err)
	}
	w := &countingWatcher{watcher: real, in: make(chan struct{}), out: make(chan struct{})}
	old := startWatch
	startWatch = func() (watcher, error) { return w, nil }
	t.Cleanup(func() { startWatch = old })
	return w
}

// waitTickets waits (without a deadline: the goroutines are each one call away) until n
// tickets have been issued in all.
func waitTickets(s *Scanner, n uint64) {
	for s.tickets.Load() < n {
		runtime.Gosched()
	}
}

// TestConcurrentLookupsSeeFileWrittenBefore: many lookups at once, each started after a file
// was written, all see it, again and again with a new file each round.
func TestConcurrentLookupsSeeFileWrittenBefore(t *testing.T) {
	for _, mode := range []string{"watched", "unwatched"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "unwatched" {
				old := startWatch
				startWatch = func() (watcher, error) { return nil, errors.New("no inotify here") }
				defer func() { startWatch = old }()
			}
			dir := t.TempDir()
			s, _ := newScanner(t, dir)
			defer s.Close()
			lookup(t, s, "x", 0)
			for round := range 20 {
				id := fmt.Sprintf("R%d", round)
				writeSession(t, dir, id+".json", id, "n"+id, true)
				var wg sync.WaitGroup
				var missed atomic.Int64
				for range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						found, err := s.Lookup(id, 0)
						if err != nil || len(found) != 1 || !found[0].Live {
							missed.Add(1)
						}
					}()
				}
				wg.Wait()
				if n := missed.Load(); n > 0 {
					t.Fatalf("round %d: %d of 64 concurrent lookups missed a file written before they started", round, n)
				}
			}
		})
	}
}

// TestWriterAndReadersInterleaved: while files keep being written, a reader that learned a
// file was written (its write returned) before it started a lookup always finds it.
func TestWriterAndReadersInterleaved(t *testing.T) {
	dir := t.TempDir()
	s, _ := newScanner(t, dir)
	defer s.Close()
	lookup(t, s, "x", 0)
	var written atomic.Int64 // the last file whose write has returned
	written.Store(-1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			writeSession(t, dir, fmt.Sprintf("w%d.json", i), fmt.Sprintf("W%d", i), fmt.Sprintf("w%d", i), true)
			written.Store(int64(i))
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				i := written.Load()
				if i < 0 {
					continue
				}
				id := fmt.Sprintf("W%d", i)
				if found, err := s.Lookup(id, 0); err != nil || len(found) != 1 {
					errs <- fmt.Sprintf("%s written before the lookup, not found (%v)", id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	<-done // the writer too, before the test can end
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// TestConcurrentLookupsShareOneRefresh: requests that queued while the index was locked are
// served by one refresh, not one each.
func TestConcurrentLookupsShareOneRefresh(t *testing.T) {
	w, dir, s := watchedScanner(t)
	writeSession(t, dir, "a.json", "A", "a", true)
	before := w.drains.Load()
	const n = 32
	s.mu.Lock() // as if a request were being served: the others queue up
	base := s.tickets.Load()
	var wg sync.WaitGroup
	var missed atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if found, err := s.Lookup("A", 0); err != nil || len(found) != 1 {
				missed.Add(1)
			}
		}()
	}
	waitTickets(s, base+n)
	s.mu.Unlock()
	wg.Wait()
	if missed.Load() > 0 {
		t.Fatalf("%d lookups missed the file", missed.Load())
	}
	if got := w.drains.Load() - before; got != 1 {
		t.Fatalf("%d queued lookups drained the watch %d times, want once", n, got)
	}
	// And one more request, arriving after all that, refreshes for itself.
	lookup(t, s, "A", 0)
	if got := w.drains.Load() - before; got != 2 {
		t.Fatalf("a later lookup: %d drains in all, want 2", got)
	}
}

// TestRefreshStartedBeforeArrivalDoesNotServe: a request that arrives while a refresh is
// under way (after its drain began) is not served by it, but by a refresh of its own: a file
// written meanwhile may have been missed by the running one.
func TestRefreshStartedBeforeArrivalDoesNotServe(t *testing.T) {
	w, dir, s := watchedScanner(t)
	w.hold.Store(true)
	first := make(chan []Session, 1)
	go func() {
		found, _ := s.Lookup("B", 0)
		first <- found
	}()
	select {
	case <-w.in: // the first lookup's refresh has drained the watch, and waits
	case <-first:
		t.Fatal("a lookup after a file event did not drain the watch")
	}
	writeSession(t, dir, "b.json", "B", "b", true)
	base := s.tickets.Load()
	second := make(chan []Session)
	go func() {
		found, _ := s.Lookup("B", 0)
		second <- found
	}()
	waitTickets(s, base+1) // the second lookup has arrived, and waits for mu
	w.out <- struct{}{}
	if got := <-first; len(got) != 0 {
		t.Fatalf("the first lookup saw a file written after its drain: %v (the test is broken)", names(got))
	}
	if got := <-second; len(got) != 1 || !got[0].Live {
		t.Fatalf("a lookup that arrived during another's refresh: %v, want the file written before it", names(got))
	}
}

// TestIncompleteRefreshServesNobody: a refresh that could not read everything (here: no
// descriptor left to open a changed file) covers no one; each request that waited on it
// tries again itself, and the file is found once descriptors are back.
func TestIncompleteRefreshServesNobody(t *testing.T) {
	w, dir, s := watchedScanner(t)
	writeSession(t, dir, "a.json", "A", "a", true)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	const n = 8
	before := w.drains.Load()
	s.mu.Lock()
	low := lim
	low.Cur = 0 // every open now fails with EMFILE; the descriptors open stay usable
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		s.mu.Unlock()
		t.Fatal(err)
	}
	base := s.tickets.Load()
	var wg sync.WaitGroup
	var incomplete atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Lookup("A", 0); errors.Is(err, ErrScanIncomplete) {
				incomplete.Add(1)
			}
		}()
	}
	waitTickets(s, base+n)
	s.mu.Unlock()
	wg.Wait()
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if got := incomplete.Load(); got != n {
		t.Fatalf("%d of %d lookups answered incomplete, want all", got, n)
	}
	if got := w.drains.Load() - before; got != n {
		t.Fatalf("%d drains for %d lookups after incomplete refreshes, want one each", got, n)
	}
	if got := lookup(t, s, "A", 0); len(got) != 1 {
		t.Fatalf("after descriptors are back: %v", names(got))
	}
}
