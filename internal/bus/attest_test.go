package bus

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/xmsg/xmsg/internal/peercred"
)

// TestRecheckSeesCloserSession: a connection attested to a farther ancestor's session (this
// test process's) is attested again once a process closer to it becomes a session of its
// own, by a session file or by a registration: the closest ancestor with a session is the
// caller's session, cached or not. Mutants tried: Still ignoring closer (red: the file case);
// Recheck not checking the registrations (red: the registration case); Attest keeping no
// closer chain (red: both).
func TestRecheckSeesCloserSession(t *testing.T) {
	for _, how := range []string{"session file", "registration"} {
		t.Run(how, func(t *testing.T) {
			b, dir := newBus(t)
			child := exec.Command("sleep", "60")
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { child.Process.Kill(); child.Wait() }()
			a, err := b.Attest(child.Process.Pid, nil)
			if err != nil {
				t.Fatal(err)
			}
			if a.Caller.SessionID != "11111111-aaaa-bbbb-cccc-000000000001" || !a.Recheck() {
				t.Fatalf("attested %+v (recheck %v), want this process's session, still so", a.Caller, a.Recheck())
			}
			start, err := peercred.Proc{}.StartTime(child.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			want := ""
			switch how {
			case "session file":
				want = "22222222-aaaa-bbbb-cccc-000000000001"
				raw, _ := json.Marshal(map[string]any{"pid": child.Process.Pid, "sessionId": want, "name": "carol", "cwd": "/",
					"status": "idle", "procStart": start, "messagingSocketPath": filepath.Join(dir, "carol.sock")})
				if err := os.WriteFile(filepath.Join(dir, "s", "carol.json"), raw, 0o600); err != nil {
					t.Fatal(err)
				}
			case "registration":
				r, err := b.RegisterSession("pi", "carol", "/", peercred.Cred{PID: child.Process.Pid, UID: uint32(os.Geteuid())}, start)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Unregister(r)
				want = r.SessionID
			}
			if a.Recheck() {
				t.Fatalf("recheck still says %s after the caller itself became session %s", a.Caller.SessionID, want)
			}
			a, err = b.Attest(child.Process.Pid, nil)
			if err != nil || a.Caller.SessionID != want {
				t.Fatalf("attested again: %+v %v, want session %s", a.Caller, err, want)
			}
			if !a.Recheck() {
				t.Fatal("the new attestation does not hold")
			}
		})
	}
}

// TestRecheckSeesCloserSessionOfRegistered: the same for a caller attested to a registered
// ancestor (a pi session) when a process below it writes a session file. Mutant tried:
// Recheck skipping the file check for registered callers (red).
func TestRecheckSeesCloserSessionOfRegistered(t *testing.T) {
	b, dir := newBus(t)
	parent := exec.Command("sh", "-c", "sleep 60 & echo $!; wait")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { parent.Process.Kill(); parent.Wait() }()
	var pid int
	if _, err := fmt.Fscan(out, &pid); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	proc := peercred.Proc{}
	pstart, _ := proc.StartTime(parent.Process.Pid)
	r, err := b.RegisterSession("pi", "dave", "/", peercred.Cred{PID: parent.Process.Pid, UID: uint32(os.Geteuid())}, pstart)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unregister(r)
	a, err := b.Attest(pid, nil)
	if err != nil || a.Caller.SessionID != r.SessionID || !a.Recheck() {
		t.Fatalf("attested %+v %v, want the registered parent %s, still so", a.Caller, err, r.SessionID)
	}
	start, _ := proc.StartTime(pid)
	want := "33333333-aaaa-bbbb-cccc-000000000001"
	raw, _ := json.Marshal(map[string]any{"pid": pid, "sessionId": want, "name": "erin", "cwd": "/",
		"status": "idle", "procStart": start, "messagingSocketPath": filepath.Join(dir, "erin.sock")})
	if err := os.WriteFile(filepath.Join(dir, "s", "erin.json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if a.Recheck() {
		t.Fatal("recheck still holds after the caller itself wrote a session file")
	}
	if a, err = b.Attest(pid, nil); err != nil || a.Caller.SessionID != want {
		t.Fatalf("attested again: %+v %v, want session %s", a.Caller, err, want)
	}
}
