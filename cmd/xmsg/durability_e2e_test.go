package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
)

func runWorker(t *testing.T, d *daemon, env ...string) []string {
	t.Helper()
	cmd := ostest.Command("", "worker")
	cmd.Env = append(cmd.Env, append([]string{"NAME=worker", "REGISTER_SOCK=" + d.sock("register")}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("worker: %v", err)
	}
	return strings.Fields(string(out))
}

// TestQueuedMessagesSurviveDaemonKill: messages accepted for a service that is not connected
// are committed before the 202; a kill -9 of the daemon loses none, and after the restart the
// re-registered service receives each exactly once, in order.
func TestQueuedMessagesSurviveDaemonKill(t *testing.T) {
	self, err := filepath.EvalSymlinks(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, "--svc-exe", "worker="+self)
	// Not connected: it can be sent to (below), but it is no live session.
	status, v := d.do("GET", "/v1/sessions/svc:worker", "")
	wantError(t, status, v, 404, "not_found")
	var want []string
	for i := range 5 {
		text := fmt.Sprintf("m%d", i)
		if status, v := d.do("POST", "/v1/sessions/svc:worker/messages", `{"from":"a","text":"`+text+`"}`); status != 202 {
			t.Fatalf("send %d = %d %v", i, status, v)
		}
		want = append(want, text)
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
	d.start()
	// A worker that dies before its ack gets the same message again next time.
	if got := runWorker(t, d, "NO_ACK=1"); strings.Join(got, ",") != "m0" {
		t.Fatalf("un-acked worker got %v, want [m0]", got)
	}
	if got := runWorker(t, d); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("after kill -9 and restart the worker got %v, want %v", got, want)
	}
	if got := runWorker(t, d); len(got) != 0 {
		t.Errorf("acked messages came again: %v", got)
	}
}
