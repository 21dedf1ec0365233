package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// gateWriter holds the first Write until release is closed, after saying so on started.
type gateWriter struct {
	buf              bytes.Buffer
	started, release chan struct{}
	held             bool
}

func (w *gateWriter) Write(p []byte) (int, error) {
	if !w.held {
		w.held = true
		close(w.started)
		<-w.release
	}
	return w.buf.Write(p)
}

// TestBackupConsistentWhileWritesGoOn: commits go on while a backup is being written (its
// read transaction open), and the copy holds exactly what was committed before it began.
func TestBackupConsistentWhileWritesGoOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	s := open(t, path)
	defer s.Close()
	put := func(prefix string, n int, text string) {
		err := s.Update(func(tx *Tx) error {
			for i := range n {
				if err := tx.PutMessage(Message{ID: fmt.Sprintf("%s-%04d", prefix, i), FromName: text}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Room in the file for the writes below: while a read transaction is open bbolt cannot
	// grow (remap) the file, so a write that needed more room would wait for the backup.
	put("filler", 200, strings.Repeat("f", 1000))
	if err := s.Update(func(tx *Tx) error {
		for i := range 200 {
			if err := tx.DeleteMessage(fmt.Sprintf("filler-%04d", i)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s.Update(func(*Tx) error { return nil }) // the deleted pages become free for reuse
	put("before", 10, "b")

	w := &gateWriter{started: make(chan struct{}), release: make(chan struct{})}
	var size int64
	done := make(chan error, 1)
	go func() {
		_, err := s.Backup(w, func(n int64) { size = n })
		done <- err
	}()
	<-w.started
	for i := range 10 { // ten commits while the copy is held at its first byte
		put(fmt.Sprintf("during%d", i), 1, "d")
	}
	close(w.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if int64(w.buf.Len()) != size {
		t.Fatalf("backup wrote %d bytes, announced %d", w.buf.Len(), size)
	}
	cp := filepath.Join(t.TempDir(), "copy.db")
	if err := os.WriteFile(cp, w.buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	c := open(t, cp)
	defer c.Close()
	c.View(func(tx *Tx) error {
		for i := range 10 {
			if _, ok, _ := tx.Message(fmt.Sprintf("before-%04d", i)); !ok {
				t.Errorf("the copy lacks before-%04d, committed before the backup began", i)
			}
			if _, ok, _ := tx.Message(fmt.Sprintf("during%d-0000", i)); ok {
				t.Errorf("the copy holds during%d-0000, committed after the backup began", i)
			}
		}
		return nil
	})
	if s.Info().LastBackup.IsZero() {
		t.Error("no last backup time recorded")
	}
}
