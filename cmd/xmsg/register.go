package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
)

// registerTimeout bounds each register.sock exchange of the hook helper (docs/protocol.md §4.3).
const registerTimeout = 2 * time.Second

const registerAbout = `Run by Antigravity as a hook (docs/protocol.md §4.3). It never fails the hook: errors go to
stderr, stdout is always one JSON object, and the exit code is 0 (only a bad command line is 2).
`

// registerFlags: `xmsg register agy [--hook] [--sock P] [--url U]` (docs/protocol.md §4.3,
// §10.3), run by Antigravity as a hook.
func registerFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	hook := fs.Bool("hook", false, "answer the agy hook: ask for registration unless credentials are held")
	sockFlag := fs.String("sock", "", "register.sock (env XMSG_REGISTER_SOCK)")
	urlFlag := fs.String("url", "", "fallback bus URL (env XMSG_URL, default http://127.0.0.1:7787)")
	return func(pos []string) error {
		if len(pos) != 1 || pos[0] != "agy" {
			return usageError{"usage: xmsg register agy [--hook] [--sock P] [--url U]"}
		}
		sock, sockErr := sockPath("register", *sockFlag)
		if *hook {
			fmt.Fprintln(s.out, hookAnswer(s.in, sock, sockErr, *sockFlag, *urlFlag, s.err))
			return nil
		}
		if sockErr == nil {
			sockErr = registerAgy(sock)
		}
		if sockErr != nil {
			fmt.Fprintln(s.err, "xmsg register agy:", sockErr)
		}
		fmt.Fprintln(s.out, `{"injectSteps":[]}`)
		return nil
	}
}

// registerAgy sends the credential frame. The credentials come from the environment only
// (never argv) and are not printed, even in errors.
func registerAgy(sock string) error {
	frame, err := json.Marshal(map[string]string{
		"conversation_id": os.Getenv("ANTIGRAVITY_CONVERSATION_ID"),
		"ls_address":      os.Getenv("ANTIGRAVITY_LS_ADDRESS"),
		"csrf_token":      os.Getenv("ANTIGRAVITY_CSRF_TOKEN"),
	})
	if err != nil {
		return err
	}
	ans, err := registerCall(sock, frame)
	if err != nil {
		return err
	}
	if ans["status"] != "ok" {
		return fmt.Errorf("refused: %v %v", ans["error"], ans["detail"])
	}
	return nil
}

// registerCall writes one frame to register.sock and reads one answer, after checking the
// socket directory as the daemon does (not a symlink, ours, mode 0700).
func registerCall(sock string, frame []byte) (map[string]any, error) {
	if err := activation.EnsureDir(filepath.Dir(sock)); err != nil {
		return nil, err
	}
	c, err := net.DialTimeout("unix", sock, registerTimeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(registerTimeout))
	if _, err := c.Write(append(frame, '\n')); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(io.LimitReader(c, 1<<16)).ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	var ans map[string]any
	if err := json.Unmarshal(line, &ans); err != nil {
		return nil, errors.New("unreadable answer")
	}
	return ans, nil
}

// hookAnswer is the --hook output: {} when the conversation's credentials are held (or on any
// error), else a step asking the agent to run the registration.
func hookAnswer(stdin io.Reader, sock string, sockErr error, sockFlag, urlFlag string, stderr io.Writer) string {
	var in struct {
		ConversationID string `json:"conversationId"`
	}
	if err := json.NewDecoder(io.LimitReader(stdin, 1<<20)).Decode(&in); err != nil || in.ConversationID == "" {
		fmt.Fprintln(stderr, "xmsg register agy --hook: no conversationId on stdin")
		return "{}"
	}
	has, err := hasCredentials(in.ConversationID, sock, sockErr, urlFlag)
	if err != nil {
		fmt.Fprintln(stderr, "xmsg register agy --hook:", err)
		return "{}"
	}
	if has {
		return "{}"
	}
	exe, err := os.Executable()
	if err != nil {
		exe = "xmsg"
	}
	run := exe + " register agy"
	if sockFlag != "" {
		run += " --sock " + sockFlag
	}
	out, _ := json.Marshal(map[string]any{"injectSteps": []any{map[string]string{
		"ephemeralMessage": "Please run `" + run + "` before anything else, and reply with nothing about it."}}})
	return string(out)
}

// hasCredentials asks register.sock `check`; if that fails, GET /v1/sessions/<conv> over
// http.sock, then over --url, reading `registered`.
func hasCredentials(conv, sock string, sockErr error, urlFlag string) (bool, error) {
	if sockErr == nil {
		frame, _ := json.Marshal(map[string]string{"action": "check", "conversation_id": conv})
		if ans, err := registerCall(sock, frame); err == nil && ans["status"] == "ok" {
			has, _ := ans["hasCredentials"].(bool)
			return has, nil
		}
	}
	path := "/v1/sessions/" + url.PathEscape(conv)
	var lastErr error = errors.New("the bus is unreachable")
	if hs, err := sockPath("http", ""); err == nil {
		var v map[string]any
		err := newBusClient(hs).do(http.MethodGet, path, nil, &v)
		var ee exitError
		switch {
		case err == nil:
			return v["registered"] == true, nil
		case errors.As(err, &ee) && ee.code == exitRefused:
			return false, nil // the bus answered: no such registered session (404)
		}
		lastErr = err
	}
	base := urlFlag
	if base == "" {
		base = os.Getenv("XMSG_URL")
	}
	if base == "" {
		base = "http://127.0.0.1:7787"
	}
	client := &http.Client{Timeout: registerTimeout}
	resp, err := client.Get(strings.TrimSuffix(base, "/") + path)
	if err != nil {
		return false, lastErr
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return false, nil
	}
	var v map[string]any
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v) != nil {
		return false, fmt.Errorf("bus answered %d", resp.StatusCode)
	}
	return v["registered"] == true, nil
}
