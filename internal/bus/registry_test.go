package bus

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

// fakeProc is a procfs tree the test controls: processes and the boot id.
type fakeProc struct {
	t    *testing.T
	root string
}

func newFakeProc(t *testing.T) *fakeProc {
	f := &fakeProc{t: t, root: t.TempDir()}
	f.boot("boot-1")
	return f
}

func (f *fakeProc) boot(id string) {
	dir := filepath.Join(f.root, "sys", "kernel", "random")
	os.MkdirAll(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "boot_id"), []byte(id+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// run makes pid a live process with start time start (or removes it when start is "").
func (f *fakeProc) run(pid int, start string) {
	dir := filepath.Join(f.root, fmt.Sprint(pid))
	if start == "" {
		os.RemoveAll(dir)
		return
	}
	os.MkdirAll(dir, 0o755)
	fields := make([]string, 20)
	for i := range fields {
		fields[i] = "0"
	}
	fields[0], fields[1], fields[19] = "S", "1", start // state, ppid, starttime (field 22)
	stat := fmt.Sprintf("%d (pi) %s\n", pid, strings.Join(fields, " "))
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func fakeBus(t *testing.T, proc peercred.Proc, db string) (*Bus, func()) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(db, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b := New(Config{Host: "h", MaxBody: 100, ReplyTTL: time.Hour, IdemTTL: time.Hour, Store: st, Proc: proc, Log: log,
		Claude: &claude.Scanner{Proc: proc, UID: os.Geteuid(), Log: log}})
	var once sync.Once
	stop := func() { once.Do(func() { b.Close(); st.Close() }) }
	t.Cleanup(stop)
	return b, stop
}

// TestSessionIDBelongsToTheProcess: the id is kept across a daemon restart for the same
// process, and never handed to another process: not to another pid, not to the same pid with
// another start time (a recycled pid), not to the same pid and start time in another boot.
func TestSessionIDBelongsToTheProcess(t *testing.T) {
	fp := newFakeProc(t)
	proc := peercred.Proc{Root: fp.root}
	db := filepath.Join(t.TempDir(), "x.db")
	uid := uint32(os.Geteuid())
	register := func(b *Bus, pid int) string {
		t.Helper()
		r, err := b.RegisterSession("pi", "n", "", peercred.Cred{PID: pid, UID: uid}, "")
		if err != nil {
			t.Fatalf("register pid %d: %v", pid, err)
		}
		return r.SessionID
	}
	fp.run(100, "5000")
	fp.run(200, "5000")
	b, stop := fakeBus(t, proc, db)
	id := register(b, 100)
	if again := register(b, 100); again != id {
		t.Fatalf("same process again: %s, want %s", again, id)
	}
	if other := register(b, 200); other == id {
		t.Fatalf("another pid got the id %s", id)
	}
	stop()

	// A daemon restart: the same live process gets its id back from the store.
	b, _ = fakeBus(t, proc, db)
	if again := register(b, 100); again != id {
		t.Fatalf("same process after a restart: %s, want %s", again, id)
	}
	// The pid is recycled: another start time is another process.
	fp.run(100, "6000")
	if recycled := register(b, 100); recycled == id {
		t.Fatalf("recycled pid got the id %s", id)
	}
	// Another boot with the very same pid and start time is another process too.
	fp.run(100, "5000")
	fp.boot("boot-2")
	if reboot := register(b, 100); reboot == id {
		t.Fatalf("same pid and start time in another boot got the id %s", id)
	}
	// Exited processes and other boots are pruned; the live one of this boot is kept.
	b.Purge(time.Now())
	var recs []store.ProcessSession
	b.cfg.Store.View(func(tx *store.Tx) (err error) { recs, err = tx.ProcessSessions(); return err })
	for _, r := range recs {
		if r.Boot != "boot-2" {
			t.Errorf("record of an earlier boot kept: %+v", r)
		}
	}
	if len(recs) != 1 || recs[0].PID != 100 {
		t.Errorf("records after prune: %+v, want only pid 100 of boot-2", recs)
	}
	id200 := register(b, 200)
	b.mu.Lock()
	b.regs, b.regIdx = map[string]*Registration{}, regIndex{} // its connection ended; the process lives on
	b.mu.Unlock()
	if tg, err := b.Resolve(id200); err != nil || tg.SessionID != id200 || !tg.Offline {
		t.Fatalf("Resolve(id of a live, unregistered process) = %+v, %v; want it addressable (queued)", tg, err)
	}
	fp.run(200, "")
	if _, err := b.Resolve(id200); err == nil {
		t.Fatal("the id of an exited process still resolves")
	}
	b.Purge(time.Now())
	b.cfg.Store.View(func(tx *store.Tx) (err error) { recs, err = tx.ProcessSessions(); return err })
	if len(recs) != 1 || recs[0].PID != 100 {
		t.Errorf("records after pid 200 exited: %+v, want only pid 100", recs)
	}
	// Without a boot id, no id is handed out at all (fail closed).
	os.Remove(filepath.Join(fp.root, "sys", "kernel", "random", "boot_id"))
	if _, err := b.RegisterSession("pi", "n", "", peercred.Cred{PID: 100, UID: uid}, ""); err == nil {
		t.Fatal("registration without a boot id succeeded")
	}
}

// bareID is TrimPrefix(SessionID, Harness+":") without building the prefix.
func TestBareIDIsTrimPrefix(t *testing.T) {
	for _, c := range []struct{ harness, id string }{
		{"svc", "svc:x"}, {"pi", "pi:0b7e"}, {"svc", "svcx"}, {"svc", "svc:"}, {"svc", "sv"},
		{"svc", "pi:svc:x"}, {"", ":x"}, {"", "x"}, {"codex", "codex:svc:y"}, {"svc", "SVC:x"},
	} {
		r := &Registration{Harness: c.harness, SessionID: c.id}
		if got, want := r.bareID(), strings.TrimPrefix(c.id, c.harness+":"); got != want {
			t.Errorf("bareID(%q, %q) = %q, want %q", c.harness, c.id, got, want)
		}
	}
}
