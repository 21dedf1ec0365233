package agy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Timeout bounds one agentapi call (docs/protocol.md §5.3).
const Timeout = 5 * time.Second

// Outcome of one agentapi call.
type Outcome string

const (
	Delivered  Outcome = "delivered"
	AuthFailed Outcome = "auth_failed" // the credentials are stale (503 credentials_stale)
	Failed     Outcome = "failed"      // non-zero exit (502)
	TimedOut   Outcome = "timeout"     // 504
)

// maxOutput bounds what is kept of the child's output (to recognise an auth failure).
const maxOutput = 64 << 10

// Send runs `bin agentapi send-message --title <title> <conversation> <envelope>` as an argv
// vector (no shell). The credentials are passed only in the child's environment
// (ANTIGRAVITY_LS_ADDRESS, ANTIGRAVITY_CSRF_TOKEN), never in argv, and never logged; any
// ANTIGRAVITY_* of our own environment is dropped first.
func Send(bin string, c Credentials, title, envelope string) (Outcome, error) {
	if _, err := ValidConversation(c.Conversation); err != nil {
		return Failed, err
	}
	if !token68(c.LSAddress, maxAddress) || !token68(c.CSRFToken, maxToken) {
		return Failed, errors.New("agy: invalid credentials")
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "agentapi", "send-message", "--title", title, c.Conversation, envelope)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ANTIGRAVITY_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "ANTIGRAVITY_LS_ADDRESS="+c.LSAddress, "ANTIGRAVITY_CSRF_TOKEN="+c.CSRFToken)
	var out capped
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	switch {
	case ctx.Err() != nil:
		return TimedOut, errors.New("agy: agentapi timed out")
	case err == nil:
		return Delivered, nil
	case authFailure(out.Bytes()):
		return AuthFailed, errors.New("agy: agentapi refused the credentials")
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return Failed, errors.New("agy: agentapi exited with status " + exit.ProcessState.String())
	}
	return Failed, errors.New("agy: agentapi could not run")
}

// authFailure recognises agentapi's answer to stale credentials.
func authFailure(out []byte) bool {
	s := strings.ToLower(string(out))
	for _, w := range []string{"unauthenticated", "unauthorized", "401", "403", "csrf"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

type capped struct{ bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := maxOutput - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
