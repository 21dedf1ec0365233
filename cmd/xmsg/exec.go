package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/ledger"
)

const execUsage = "usage: xmsg exec --credential NAME[=ENVVAR] [--credential ...] [--fd N] [--agent-sock P] -- CMD [ARGS...]"

// execTimeout bounds the exchange with the daemon.
const execTimeout = 10 * time.Second

// credentialWant is one --credential: the secret and the variable that will name its path.
type credentialWant struct {
	name, env string
	fd        int
}

// execCmd is `xmsg exec` (docs/protocol.md §4.4): the short-lived helper between a service
// and the program that needs the service's secret. Run by (or below) a registered service, it
// asks agent.sock for each secret (attested by ancestry to that service, under the service's
// custody policy), places each descriptor at a fixed number (--fd, then the next ones), and
// execs CMD with ENVVAR=/proc/self/fd/N. The value never passes through argv, the
// environment, a file or the service's memory; the descriptor is not close-on-exec for CMD
// only (it is CMD's to pass on or not).
func execCmd(args []string) error { return lookup("exec").run(args, stdio{}) }

const execAbout = `Run by (or below) a registered service: asks agent.sock for each secret (attested to that
service, under its custody policy), places each descriptor at --fd, then the next numbers, and
execs CMD with ENVVAR=/proc/self/fd/N (ENVVAR defaults to NAME in capitals with _FILE). The
value never passes through argv, the environment or a file (docs/protocol.md §4.4).
`

func execFlags(fs *flag.FlagSet, _ stdio) func([]string) error {
	var wants []credentialWant
	fs.Func("credential", "NAME[=ENVVAR]: a custody secret to pass as a descriptor (repeat for more)", func(val string) error {
		name, env, ok := strings.Cut(val, "=")
		if !ok {
			env = defaultCredentialEnv(name)
		}
		if !custody.ValidName(name) || !validEnvName(env) {
			return fmt.Errorf("want NAME[=ENVVAR]")
		}
		wants = append(wants, credentialWant{name: name, env: env})
		return nil
	})
	first := fs.Int("fd", 3, "the descriptor number of the first secret (3 to 1000)")
	sock := fs.String("agent-sock", "", "the bus's agent.sock (env XMSG_AGENT_SOCK)")
	return func(argv []string) error {
		if *first < 3 || *first > 1000 {
			return usageError{"xmsg exec: --fd wants a number from 3 to 1000 (0, 1 and 2 are stdio)"}
		}
		if len(wants) == 0 || len(argv) == 0 {
			return usageError{execUsage}
		}
		return execWith(wants, *first, *sock, argv)
	}
}

// execWith runs argv with wants as descriptors from first on.
func execWith(wants []credentialWant, first int, sock string, argv []string) error {
	for k := range wants {
		wants[k].fd = first + k
	}
	// Before anything else opens a descriptor: the target numbers are taken now, so that
	// nothing this process opens meanwhile (the Go runtime's poller among them) can land on
	// one and be replaced under it.
	if err := reserveFDs(wants); err != nil {
		return err
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return usageError{fmt.Sprintf("xmsg exec: %v", err)}
	}
	sp, err := sockPath("agent", sock)
	if err != nil {
		return err
	}
	files, err := fetchCredentials(sp, wants)
	if err != nil {
		return err
	}
	env := os.Environ()
	for k, w := range wants {
		env = setEnv(env, w.env, "/proc/self/fd/"+strconv.Itoa(w.fd))
		if err := placeFD(files[k], w.fd); err != nil {
			return err
		}
	}
	return execve(path, argv, env)
}

// fetchCredentials asks agent.sock for each secret on one connection.
func fetchCredentials(sock string, wants []credentialWant) ([]*os.File, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("xmsg exec: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(execTimeout))
	var files []*os.File
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, err
	}
	for _, w := range wants {
		frame, _ := json.Marshal(map[string]string{"action": "credential", "name": w.name})
		if _, err := c.Write(append(frame, '\n')); err != nil {
			return fail(fmt.Errorf("xmsg exec: %w", err))
		}
		line, f, err := custody.ReadFD(c, 64<<10)
		if err != nil {
			return fail(fmt.Errorf("xmsg exec: %w", err))
		}
		var ans struct {
			Status, Error, Detail string
		}
		json.Unmarshal(line, &ans)
		if ans.Status != "ok" || f == nil {
			if f != nil {
				f.Close()
			}
			if ans.Error == "" {
				ans.Error, ans.Detail = ledger.Internal.String(), "no descriptor with the answer"
			}
			return fail(exitError{exitRefused, fmt.Errorf("exec: credential %s: %s: %s", w.name, ans.Error, ans.Detail)})
		}
		if err := custody.CheckSealed(int(f.Fd())); err != nil {
			f.Close()
			return fail(err)
		}
		files = append(files, f)
	}
	return files, nil
}

// defaultCredentialEnv is NAME upper-cased, '-' and '.' as '_', with _FILE: gh-token →
// GH_TOKEN_FILE (the usual name of a variable that holds a path to a secret).
func defaultCredentialEnv(name string) string {
	return strings.NewReplacer("-", "_", ".", "_").Replace(strings.ToUpper(name)) + "_FILE"
}

func validEnvName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// setEnv replaces every k= entry of env with k=v.
func setEnv(env []string, k, v string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, k+"=") {
			out = append(out, e)
		}
	}
	return append(out, k+"="+v)
}
