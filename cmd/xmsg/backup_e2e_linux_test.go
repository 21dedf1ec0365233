//go:build linux

package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/fed/fedtest"
	"github.com/xmsg/xmsg/internal/store"
	bolt "go.etcd.io/bbolt"
)

// runXmsg runs the CLI and returns its stdout, stderr and exit status.
func runXmsg(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := xmsgCmd(env, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("xmsg %v: %v", args, err)
	}
	return out.String(), errb.String(), 0
}

// TestBackupWhileSending: `xmsg backup` takes a copy of the running hub's store while sends
// go on; a daemon started on the copy serves every message acknowledged before the backup
// began. The TCP listener, which has no peer check, refuses it.
func TestBackupWhileSending(t *testing.T) {
	self, err := filepath.EvalSymlinks(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, "--svc-exe", "worker="+self, "--listen", "127.0.0.1:0")
	send := func(text string) bool {
		status, _ := d.do("POST", "/v1/sessions/svc:worker/messages", `{"from":"a","text":"`+text+`"}`)
		return status == 202
	}
	var before []string
	for i := range 20 {
		text := fmt.Sprintf("b%d", i)
		if !send(text) {
			t.Fatalf("send %s refused", text)
		}
		before = append(before, text)
	}
	// Sends go on during the backup, from another goroutine.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var during []string
	failed := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			text := fmt.Sprintf("d%d", i)
			if send(text) {
				during = append(during, text)
			} else {
				failed++
			}
		}
	}()
	dir := t.TempDir()
	file := filepath.Join(dir, "tier.db")
	out, errOut, code := runXmsg(t, d.env, "backup", "--http-sock", d.sock("http"), file)
	close(stop)
	wg.Wait()
	if code != 0 {
		t.Fatalf("xmsg backup: status %d, %s%s", code, out, errOut)
	}
	if failed > 0 {
		t.Errorf("%d sends failed during the backup", failed)
	}
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("backup mode %v, want 0600", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("backup dir holds %d entries, want the file alone (no temporary left)", len(ents))
	}
	// A second backup onto the same name replaces it whole.
	if _, errOut, code := runXmsg(t, d.env, "backup", "--http-sock", d.sock("http"), file); code != 0 {
		t.Fatalf("second backup: status %d, %s", code, errOut)
	}
	// The daemon's own file is in use: refused, not replaced.
	if _, errOut, code := runXmsg(t, d.env, "backup", "--http-sock", d.sock("http"), d.db); code != exitUsage || !strings.Contains(errOut, "in use") {
		t.Errorf("backup onto the live store: status %d, %q; want %d and 'in use'", code, errOut, exitUsage)
	}
	// The TCP listener has no peer check: no backup there.
	if _, errOut, code := runXmsg(t, d.env, "backup", "--url", "http://"+tcpAddr(t, d), filepath.Join(dir, "tcp.db")); code != exitRefused || !strings.Contains(errOut, "op_denied") {
		t.Errorf("backup over TCP: status %d, %q; want %d op_denied", code, errOut, exitRefused)
	}
	doc, _, _ := runXmsg(t, d.env, "doctor", "--http-sock", d.sock("http"))
	if !strings.Contains(doc, fmt.Sprintf("store: %s, format %d, ", d.db, store.Format)) || !strings.Contains(doc, "last backup 20") {
		t.Errorf("doctor does not show the store's format and last backup:\n%s", doc)
	}

	// A daemon on the copy.
	r := newDaemonOn(t, file, "--svc-exe", "worker="+self)
	got := runWorker(t, r)
	if len(got) < len(before) || strings.Join(got[:len(before)], ",") != strings.Join(before, ",") {
		t.Fatalf("the daemon on the backup served %v, want %v first", got, before)
	}
	for _, text := range got[len(before):] {
		if !strings.HasPrefix(text, "d") {
			t.Errorf("the daemon on the backup served %q, never sent", text)
		}
	}
}

// newDaemonOn starts a daemon (as newDaemon) on the store file db.
func newDaemonOn(t *testing.T, db string, extra ...string) *daemon {
	t.Helper()
	base := shortTemp(t)
	d := &daemon{t: t, rt: filepath.Join(base, "rt"), db: db, sess: filepath.Join(base, "sessions")}
	os.Mkdir(d.rt, 0o700)
	os.Mkdir(d.sess, 0o700)
	d.env = []string{"XDG_RUNTIME_DIR=" + d.rt, "HOME=" + base}
	d.args = append([]string{"serve", "--db-path", d.db, "--sessions-dir", d.sess, "--host-label", "testhost"}, extra...)
	d.start()
	t.Cleanup(d.stop)
	return d
}

// TestBackupLeaf: a leaf serves backups on its http.sock too.
func TestBackupLeaf(t *testing.T) {
	hub := fedtest.New(t, "testhost", nil, fedtest.Options{})
	l := newLeafDaemon(t, fedtest.New(t, "leaf1", nil, fedtest.Options{}), freePort(t), hub.Pin)
	file := filepath.Join(t.TempDir(), "leaf.db")
	if out, errOut, code := runXmsg(t, l.env, "backup", "--http-sock", l.sock("http"), file); code != 0 {
		t.Fatalf("xmsg backup of a leaf: status %d, %s%s", code, out, errOut)
	}
	s, err := store.Open(file, time.Second)
	if err != nil {
		t.Fatalf("the leaf's backup: %v", err)
	}
	defer s.Close()
	if got := s.MigratedFrom(); got != store.Format {
		t.Errorf("the leaf's backup is format %d, want %d", got, store.Format)
	}
}

// TestServeRefusesDamagedStore: a damaged, foreign or newer store stops `xmsg serve` with
// exit status 65 (the units' RestartPreventExitStatus=) and one line that names the file,
// and the file is byte for byte as it was.
func TestServeRefusesDamagedStore(t *testing.T) {
	// A good store of a few pages, to damage.
	good := filepath.Join(t.TempDir(), "good.db")
	s, err := store.Open(good, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s.Update(func(tx *store.Tx) error {
		for i := range 100 {
			tx.PutMessage(store.Message{ID: fmt.Sprintf("01900000-0000-7000-9000-%012d", i), FromName: strings.Repeat("x", 200)})
		}
		return nil
	})
	var copyBuf bytes.Buffer
	if _, err := s.Backup(&copyBuf, nil); err != nil {
		t.Fatal(err)
	}
	s.Close()
	raw := copyBuf.Bytes()
	ps := 4096
	sqlite, err := os.ReadFile("../../internal/store/testdata/other.sqlite")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		damage func([]byte) []byte
	}{
		{"truncated: last page", func(b []byte) []byte { return b[:len(b)-ps] }},
		{"truncated: mid-file", func(b []byte) []byte { return b[:len(b)/2+100] }},
		{"zeroed meta page", func(b []byte) []byte { clear(b[:ps]); return b }},
		{"zeroed meta pages", func(b []byte) []byte { clear(b[:2*ps]); return b }},
		{"zeroed data page", func(b []byte) []byte { clear(b[len(b)-ps:]); return b }},
		{"wrong magic", func(b []byte) []byte {
			binary.NativeEndian.PutUint32(b[16:], 0xDEADBEEF)
			binary.NativeEndian.PutUint32(b[ps+16:], 0xDEADBEEF)
			return b
		}},
		{"random bytes", func(b []byte) []byte { rand.Read(b); return b }},
		{"a SQLite database", func([]byte) []byte { return sqlite }},
		{"newer format", func(b []byte) []byte { return newerFormat(t, b) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := shortTemp(t)
			db := filepath.Join(base, "state", "xmsg.db")
			os.Mkdir(filepath.Dir(db), 0o700)
			if err := os.WriteFile(db, tt.damage(bytes.Clone(raw)), 0o600); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(db)
			rt := filepath.Join(base, "rt")
			os.Mkdir(rt, 0o700)
			_, errOut, code := runXmsg(t, []string{"XDG_RUNTIME_DIR=" + rt, "HOME=" + base}, "serve", "--db-path", db, "--sessions-dir", base, "--host-label", "testhost")
			if code != exitStoreRefused {
				t.Errorf("serve on a %s store: status %d, want %d; stderr:\n%s", tt.name, code, exitStoreRefused, errOut)
			}
			var naming []string
			for _, l := range strings.Split(errOut, "\n") {
				if strings.Contains(l, db) {
					naming = append(naming, l)
				}
			}
			if len(naming) != 1 || !strings.HasPrefix(naming[0], "xmsg: store: "+db+": ") || !strings.Contains(naming[0], "backup") ||
				(tt.name == "newer format" && !strings.Contains(naming[0], fmt.Sprintf("format %d, newer than this xmsg's format %d", store.Format+1, store.Format))) {
				t.Errorf("stderr lines naming the file: %q, want one 'xmsg: store: FILE: ...' line with the remedy", naming)
			}
			after, _ := os.ReadFile(db)
			if sha256.Sum256(after) != sha256.Sum256(before) {
				t.Error("the refused store file was changed")
			}
		})
	}
}

// TestServeMigratesFormat1: a daemon started on a store of format 1 (the store package's
// fixture, written by the release before the format number) migrates it and serves its rows:
// the replies of a message over http.sock, and the mail queued for a service.
func TestServeMigratesFormat1(t *testing.T) {
	self, err := filepath.EvalSymlinks(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../../internal/store/testdata/format1.db")
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(shortTemp(t), "xmsg.db")
	if err := os.WriteFile(db, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	// The fixture's rows are of a fixed date: retention long enough that the start's purge
	// keeps them.
	ttl := "3153600000"
	d := newDaemonOn(t, db, "--svc-exe", "builder="+self, "--reply-ttl", ttl, "--idempotency-ttl", ttl)
	if !strings.Contains(d.stderr.String(), "store migrated") || !strings.Contains(d.stderr.String(), "from_format=1") {
		t.Errorf("no migration logged:\n%s", d.stderr)
	}
	status, v := d.do("GET", "/v1/messages/01900000-0000-7000-8000-000000000001/replies", "")
	list, _ := v.([]any)
	if status != 200 || len(list) != 2 || field(list[0], "text") != "first reply" || field(list[1], "text") != "second reply, ünïcödé" {
		t.Errorf("replies of the migrated message: %d %v", status, v)
	}
	if got := runWorker(t, d, "NAME=builder"); strings.Join(got, " ") != "build it" {
		t.Errorf("the service got %q from the migrated queue, want [build it]", got)
	}
}

// newerFormat returns the store raw with the format number of the next release.
func newerFormat(t *testing.T, raw []byte) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "newer.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("format"), binary.BigEndian.AppendUint64(nil, store.Format+1))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
