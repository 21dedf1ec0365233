package httpapi

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// TestBackupSlowReaderCutOff: a backup whose reader takes bytes steadily but too slowly (never
// stalling long enough for the per-write limit) is cut off by the whole copy's deadline, so the
// read transaction it holds, which keeps the store file from growing, ends. Bounded: the
// deadline here is under a second. Mutant tried: the per-write deadline alone (red: the copy
// runs on and the wait below gives up).
func TestBackupSlowReaderCutOff(t *testing.T) {
	defer func(s time.Duration, r int64) { backupStall, backupMinRate = s, r }(backupStall, backupMinRate)
	backupStall, backupMinRate = 300*time.Millisecond, 1<<40 // the copy's whole budget: 300 ms
	done := make(chan error, 1)
	backup := func(w io.Writer, begin func(int64)) (int64, error) {
		begin(1 << 30)
		chunk := make([]byte, 1024)
		var n int64
		for {
			m, err := w.Write(chunk)
			n += int64(m)
			if err != nil {
				done <- err
				return n, err
			}
		}
	}
	path, _ := serveHandler(t, Handler(Config{Log: slog.New(slog.DiscardHandler), Socket: "http", Backup: backup}), nil)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("POST /v1/admin/backup HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"))
	// A reader that keeps taking, never stalling the writer for 300 ms: up to 64 KiB every
	// 50 ms (more than the server's write buffer holds, so no single write waits long).
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		r := bufio.NewReaderSize(c, 64<<10)
		buf := make([]byte, 64<<10)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := r.Read(buf); err != nil {
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the copy ended without an error")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a slow backup reader kept the copy (and its read transaction) past its deadline")
	}
}
