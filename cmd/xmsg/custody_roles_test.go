package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/ostest"
)

// custodyRoles are the processes of the custody tests: a client asking for a secret (as a
// service on register.sock, or as anything on agent.sock) and a dispatcher-shaped service
// that hands a secret through `xmsg exec` without holding it.
var custodyRoles = ostest.Roles{
	"custody-ask":        custodyAsk,
	"custody-dispatcher": custodyDispatcher,
}

// custodyAsk connects to CUSTODY_SOCK, sends CUSTODY_REGISTER first when set (a registration
// frame), waits for a line on stdin when CUSTODY_WAIT is set, asks for CUSTODY_SECRET and
// prints what it got as one JSON line: the answer, whether a descriptor came, the value read
// from it, and what writing to it did.
func custodyAsk() int {
	out := map[string]any{}
	defer func() { json.NewEncoder(os.Stdout).Encode(out) }()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Getenv("CUSTODY_SOCK"), Net: "unix"})
	if err != nil {
		out["err"] = err.Error()
		return 0
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if reg := os.Getenv("CUSTODY_REGISTER"); reg != "" {
		c.Write([]byte(reg + "\n"))
		line, _, err := custody.ReadFD(c, 1<<16)
		out["registered"] = strings.TrimSpace(string(line))
		if err != nil {
			out["err"] = err.Error()
			return 0
		}
	}
	if os.Getenv("CUSTODY_WAIT") != "" {
		bufio.NewReader(os.Stdin).ReadString('\n')
	}
	frame, _ := json.Marshal(map[string]string{"action": "credential", "name": os.Getenv("CUSTODY_SECRET")})
	c.Write(append(frame, '\n'))
	line, f, err := custody.ReadFD(c, 1<<16)
	out["answer"] = strings.TrimSpace(string(line))
	out["fd"] = f != nil
	if err != nil {
		out["err"] = err.Error()
	}
	if f == nil {
		return 0
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	out["value"] = string(b)
	if err := custody.CheckSealed(int(f.Fd())); err != nil {
		out["sealed"] = err.Error()
	} else {
		out["sealed"] = "yes"
	}
	// The seals, not only the read-only descriptor, must stop a write: reopen read-write.
	rw, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), os.O_RDWR, 0)
	if err != nil {
		out["write"] = "reopen: " + err.Error()
		return 0
	}
	defer rw.Close()
	if _, err := rw.Write([]byte("overwritten")); err != nil {
		out["write"] = err.Error()
	} else {
		out["write"] = "ok"
	}
	if err := rw.Truncate(0); err != nil {
		out["truncate"] = err.Error()
	} else {
		out["truncate"] = "ok"
	}
	return 0
}

// custodyDispatcher registers as service NAME, then runs `xmsg exec --credential
// SECRET=TOK -- sh -c ...` as its child, the way a dispatcher starts a session: CMD reads
// the secret through $TOK into OUT and then sleeps. It prints "cmd <pid>" once CMD runs and
// "done <exit>" once CMD ended, then waits for stdin to close, so that the test can read its
// memory and descriptors.
func custodyDispatcher() int {
	c, err := net.Dial("unix", os.Getenv("REGISTER_SOCK"))
	if err != nil {
		fmt.Println("dial", err)
		return 1
	}
	defer c.Close()
	c.Write([]byte(`{"harness":"svc","name":"` + os.Getenv("NAME") + `","cwd":"/"}` + "\n"))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.Contains(line, `"ok"`) {
		fmt.Println("register", line, err)
		return 1
	}
	script := `test "$TOK" = /proc/self/fd/3 || exit 7; cat "$TOK" > "$OUT.tmp" && mv "$OUT.tmp" "$OUT" && exec sleep 120`
	cmd := ostest.Command("", "xmsg", "exec", "--credential", os.Getenv("SECRET")+"=TOK", "--", "sh", "-c", script)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Println("start", err)
		return 1
	}
	fmt.Println("cmd", cmd.Process.Pid)
	err = cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	fmt.Println("done", code)
	io.Copy(io.Discard, os.Stdin)
	return 0
}
