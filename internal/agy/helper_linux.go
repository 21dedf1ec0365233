//go:build linux

package agy

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/xmsg/xmsg/internal/exehelper"
)

// HelperArg is the hidden subcommand of the agentapi helper.
//
// The daemon's Landlock domain denies TCP connects and executing files, and a child inherits
// the domain: agentapi, which talks to Antigravity's language server over TCP, cannot run
// from inside it. So before the sandbox applies, serve starts this helper, outside the
// domain, on a socketpair that is its only channel. It runs one program (the agy binary it
// was started with) in one way (Send), and dies with its parent (PDEATHSIG).
const HelperArg = "__agy-helper"

type helperReq struct {
	Seq          uint32 `json:"seq"`
	Conversation string `json:"conversation"`
	LSAddress    string `json:"lsAddress"`
	CSRFToken    string `json:"csrfToken"`
	Title        string `json:"title"`
	Envelope     string `json:"envelope"`
}

type helperAns struct {
	Seq     uint32  `json:"seq"`
	Outcome Outcome `json:"outcome"`
	Error   string  `json:"error,omitempty"`
}

// Helper is the daemon's end of a running helper.
type Helper struct {
	mu   sync.Mutex
	conn *net.UnixConn
	r    *bufio.Reader
	seq  uint32
}

// StartHelper runs `self HelperArg bin` with one end of a socketpair as fd 3.
func StartHelper(self, bin string, env []string) (*Helper, error) {
	conn, _, err := exehelper.Spawn(self, env, HelperArg, bin)
	if err != nil {
		return nil, fmt.Errorf("agy: helper: %w", err)
	}
	h := &Helper{conn: conn}
	h.r = bufio.NewReaderSize(h.conn, 4096)
	return h, nil
}

// Send asks the helper to run agentapi (see the package function Send).
func (h *Helper) Send(c Credentials, title, envelope string) (Outcome, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	h.conn.SetDeadline(time.Now().Add(Timeout + 5*time.Second))
	line, _ := json.Marshal(helperReq{Seq: h.seq, Conversation: c.Conversation, LSAddress: c.LSAddress, CSRFToken: c.CSRFToken, Title: title, Envelope: envelope})
	if _, err := h.conn.Write(append(line, '\n')); err != nil {
		return Failed, fmt.Errorf("agy: helper: %w", err)
	}
	for {
		raw, err := h.r.ReadBytes('\n')
		if err != nil {
			return Failed, fmt.Errorf("agy: helper: %w", err)
		}
		var a helperAns
		if err := json.Unmarshal(raw, &a); err != nil {
			return Failed, fmt.Errorf("agy: helper: %w", err)
		}
		if a.Seq != h.seq {
			continue // the late answer to a request that timed out
		}
		if a.Error != "" {
			return a.Outcome, errors.New(a.Error)
		}
		return a.Outcome, nil
	}
}

// Close stops the helper.
func (h *Helper) Close() error {
	if h == nil {
		return nil
	}
	return h.conn.Close()
}

// ServeHelper is the helper's loop on fd 3 for bin; it returns when the daemon closes its end.
func ServeHelper(bin string) error {
	f := os.NewFile(3, "agy-helper")
	if f == nil {
		return errors.New("agy: fd 3 missing")
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	enc := json.NewEncoder(f)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil
		}
		var req helperReq
		if err := json.Unmarshal(line, &req); err != nil {
			return errors.New("agy: helper: bad request")
		}
		out, err := Send(bin, Credentials{Conversation: req.Conversation, LSAddress: req.LSAddress, CSRFToken: req.CSRFToken}, req.Title, req.Envelope)
		a := helperAns{Seq: req.Seq, Outcome: out}
		if err != nil {
			a.Error = err.Error()
		}
		if err := enc.Encode(a); err != nil {
			return err
		}
	}
}
