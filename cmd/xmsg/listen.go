package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/harness/uid"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
)

const listenAbout = `Registers a session named NAME on register.sock, admitted by uid like a Pi session (harness
cli; xmsg list shows it), and prints each message as it arrives: its id, its sender as the bus
attests it, and its text. Others send to it by name: xmsg send NAME TEXT. Answer a message from
any terminal with xmsg reply MESSAGE_ID TEXT, or let --reply CMD answer each one: CMD runs with
sh -c, the text on its stdin and XMSG_MESSAGE_ID, XMSG_FROM in its environment; its stdout is
the reply. Each message is acknowledged once it is printed (and answered, with --reply). The
session lasts as long as the command; interrupt it to end it.
`

const replyAbout = `The reply goes through the xmsg listen that received the message (the bus takes replies only
from the recipient, and attests it by process): any xmsg listen of yours on this bus passes it
on. xmsg replies MESSAGE_ID shows the replies.
`

// listenPoll is how long one poll of the register connection waits (the bus caps it at 60 s).
const listenPoll = 30

// relayDir holds the reply sockets of the `xmsg listen` sessions of the bus whose register
// socket is reg: a 0700 directory of ours beside it (activation.EnsureDir checks it), so that
// only our uid reaches them, and each connection's uid is checked again on accept.
func relayDir(reg string) string { return filepath.Join(filepath.Dir(reg), "listen") }

// delivered is one message of the register connection's deliver frame (docs/protocol.md §4.2).
type delivered struct {
	Action    string `json:"action"`
	MessageID string `json:"messageId"`
	FromName  string `json:"fromName"`
	Text      string `json:"text"`
	Status    string `json:"status"`
	Error     string `json:"error"`
	Detail    string `json:"detail"`
}

func listenFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	regFlag := fs.String("register-sock", "", "the bus's register.sock (env XMSG_REGISTER_SOCK)")
	agentFlag := fs.String("agent-sock", "", "the bus's agent.sock, where replies go (env XMSG_AGENT_SOCK)")
	asJSON := fs.Bool("json", false, "print each message as one JSON line: messageId, from, text")
	replyCmd := fs.String("reply", "", "answer each message with the stdout of CMD (run with sh -c, the text on its stdin)")
	cwd := fs.String("cwd", "", "the directory xmsg list shows for this session (default: the current one)")
	count := fs.Int("count", 0, "end after this many messages (0: until interrupted)")
	return func(pos []string) error {
		if len(pos) != 1 {
			return usageError{"usage: xmsg listen NAME (a name others send to: xmsg send NAME TEXT)"}
		}
		if err := checkRef("NAME", pos[0]); err != nil {
			return err
		}
		if *count < 0 {
			return usageError{"--count must not be negative"}
		}
		reg, err := sockPath("register", *regFlag)
		if err != nil {
			return err
		}
		agent, err := sockPath("agent", *agentFlag)
		if err != nil {
			return err
		}
		if *cwd == "" {
			*cwd, _ = os.Getwd()
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		l := &listener{name: pos[0], reg: reg, agent: agent, json: *asJSON, replyCmd: *replyCmd, count: *count, s: s}
		return l.run(ctx, *cwd)
	}
}

type listener struct {
	name, reg, agent string
	json             bool
	replyCmd         string
	count            int
	s                stdio
	id               string
}

func (l *listener) run(ctx context.Context, cwd string) error {
	if err := activation.EnsureDir(filepath.Dir(l.reg)); err != nil {
		if why := ownerRefusal(l.reg); why != "" {
			return exitError{exitFailure, errors.New(why)}
		}
		return exitError{exitFailure, err}
	}
	c, err := net.Dial("unix", l.reg)
	if err != nil {
		return exitError{exitFailure, fmt.Errorf("cannot reach the bus at %s: %v", l.reg, err)}
	}
	defer c.Close()
	r := bufio.NewReader(c)
	frame, _ := json.Marshal(map[string]string{"harness": uid.CLI.Name(), "sessionName": l.name, "cwd": cwd})
	if _, err := c.Write(append(frame, '\n')); err != nil {
		return exitError{exitFailure, l.gone(err)}
	}
	line, err := r.ReadBytes('\n')
	if err != nil {
		return exitError{exitFailure, l.gone(err)}
	}
	if bytes.HasPrefix(line, []byte("HTTP/")) {
		return exitError{exitFailure, fmt.Errorf("%s is not a register.sock: this is http.sock, not register.sock (pass --register-sock with the register.sock path, or leave it unset)", l.reg)}
	}
	var ans struct {
		Status, SessionID, Error, Detail string
		PollAck                          bool // the daemon takes an ack on the next poll
	}
	if err := json.Unmarshal(line, &ans); err != nil {
		return exitError{exitFailure, fmt.Errorf("%s answered something that is not register.sock's: %q", l.reg, truncate(string(line), 80))}
	}
	if ans.Status != "ok" {
		return exitError{exitRefused, fmt.Errorf("%s: %s", ans.Error, ans.Detail)}
	}
	l.id = ans.SessionID
	// Without its reply socket (a path too long for a socket, say) the session still works:
	// it prints, and --reply answers; only `xmsg reply` cannot reach it, which is said.
	if relay, err := activation.Bind(filepath.Join(relayDir(l.reg), l.id+".sock")); err != nil {
		fmt.Fprintf(l.s.err, "xmsg: no reply socket, so xmsg reply cannot answer through this listen: %v\n", err)
	} else {
		defer relay.Close()
		go l.serveRelay(relay)
	}
	go func() { <-ctx.Done(); c.Close() }()
	how := "xmsg reply MESSAGE_ID TEXT"
	if l.replyCmd != "" {
		how = "--reply runs " + quoteIfOdd(l.replyCmd)
	}
	fmt.Fprintf(l.s.err, "xmsg: listening as %s (%s); send with: xmsg send %s TEXT; reply with: %s\n",
		quoteIfOdd(l.name), l.id, quoteIfOdd(l.name), how)
	// acked is the message shown last, to be acked on the next poll where the daemon takes an
	// ack there (a frame and its answer fewer per message), else by an ack frame at once.
	acked := ""
	for n := 0; l.count == 0 || n < l.count; {
		poll := map[string]any{"action": "poll", "waitSecs": listenPoll}
		if acked != "" {
			poll["ack"] = acked
		}
		frame, _ := json.Marshal(poll)
		if _, err := c.Write(append(frame, '\n')); err != nil {
			return l.ended(ctx, err)
		}
		line, err := r.ReadBytes('\n')
		if err != nil {
			return l.ended(ctx, err)
		}
		var d delivered
		if err := json.Unmarshal(line, &d); err != nil {
			return exitError{exitFailure, fmt.Errorf("bad frame from the bus: %v", err)}
		}
		if acked != "" && d.Status == "error" {
			// The ack was not stored, and the poll not carried out: the message comes again
			// (at least once), as after an ack frame's error.
			fmt.Fprintf(l.s.err, "xmsg: the bus did not take the ack of %s (%s: %s); it will come again\n", acked, d.Error, d.Detail)
			acked = ""
			continue
		}
		acked = ""
		switch {
		case d.Action == "timeout":
			continue
		case d.Action != "deliver":
			return exitError{exitRefused, fmt.Errorf("%s: %s", d.Error, d.Detail)}
		}
		if err := l.show(d); err != nil {
			return err
		}
		if l.replyCmd != "" {
			l.answer(ctx, d)
		}
		n++
		if ans.PollAck && (l.count == 0 || n < l.count) {
			acked = d.MessageID
			continue
		}
		if err := l.ack(c, r, d.MessageID); err != nil {
			return l.ended(ctx, err)
		}
	}
	return nil
}

// ack acks id with an ack frame and reads its answer.
func (l *listener) ack(c net.Conn, r *bufio.Reader, id string) error {
	ack, _ := json.Marshal(map[string]string{"action": "ack", "messageId": id})
	if _, err := c.Write(append(ack, '\n')); err != nil {
		return err
	}
	_, err := r.ReadBytes('\n')
	return err
}

// ended is the end of the register connection: an interrupt is a clean end; anything else is
// the bus going away.
func (l *listener) ended(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return exitError{exitFailure, l.gone(err)}
}

func (l *listener) gone(err error) error {
	if why := ownerRefusal(l.reg); why != "" {
		return errors.New(why)
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("the bus at %s closed the connection (it stopped, or refused the registration)", l.reg)
	}
	return fmt.Errorf("the bus at %s: %v", l.reg, err)
}

func (l *listener) show(d delivered) error {
	if l.json {
		enc := json.NewEncoder(l.s.out)
		enc.SetEscapeHTML(false)
		return enc.Encode(map[string]string{"messageId": d.MessageID, "from": d.FromName, "text": d.Text})
	}
	text := escapeText(d.Text)
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	_, err := fmt.Fprintf(l.s.out, "message %s from %s\n%s\n", d.MessageID, escapeControl(d.FromName), text)
	return err
}

// answer runs --reply's command for d and sends its stdout as the reply. A command that fails
// or prints nothing sends no reply; either is said on stderr.
func (l *listener) answer(ctx context.Context, d delivered) {
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", l.replyCmd)
	cmd.Stdin = strings.NewReader(d.Text)
	cmd.Stderr = l.s.err
	cmd.Env = append(os.Environ(), "XMSG_MESSAGE_ID="+d.MessageID, "XMSG_FROM="+d.FromName)
	out, err := cmd.Output()
	if err != nil {
		fmt.Fprintf(l.s.err, "xmsg: --reply command for %s: %v; no reply sent\n", d.MessageID, err)
		return
	}
	text := strings.TrimRight(string(out), "\n")
	if text == "" {
		fmt.Fprintf(l.s.err, "xmsg: --reply command for %s printed nothing; no reply sent\n", d.MessageID)
		return
	}
	ans, err := l.reply(d.MessageID, text)
	if err != nil {
		fmt.Fprintf(l.s.err, "xmsg: reply to %s: %v\n", d.MessageID, err)
		return
	}
	if ans.Status != "ok" {
		fmt.Fprintf(l.s.err, "xmsg: reply to %s: %s: %s\n", d.MessageID, ans.Error, escapeControl(ans.Detail))
		return
	}
	fmt.Fprintf(l.s.err, "xmsg: replied to %s\n", d.MessageID)
}

// replyAnswer is agent.sock's answer to a reply frame (docs/protocol.md §4.1).
type replyAnswer struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Reply is the stored reply (docs/protocol.md §4.1), kept as the bus wrote it for --json.
	Reply json.RawMessage `json:"reply,omitempty"`
}

// reply sends a reply as this session: from this process, which the bus attests (by its pid
// and start time) as the registered recipient.
func (l *listener) reply(messageID, text string) (replyAnswer, error) {
	var ans replyAnswer
	c, err := net.DialTimeout("unix", l.agent, 5*time.Second)
	if err != nil {
		return ans, fmt.Errorf("cannot reach agent.sock at %s: %v", l.agent, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	frame, _ := json.Marshal(map[string]string{"action": "reply", "messageId": messageID, "text": text})
	if _, err := c.Write(append(frame, '\n')); err != nil {
		return ans, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return ans, fmt.Errorf("agent.sock: %v", err)
	}
	if err := json.Unmarshal(line, &ans); err != nil {
		return ans, fmt.Errorf("agent.sock answered %q", truncate(string(line), 80))
	}
	return ans, nil
}

// relayFrame is what `xmsg reply` asks a listen to send.
type relayFrame struct {
	MessageID string `json:"messageId"`
	Text      string `json:"text"`
}

// maxRelayFrame bounds one `xmsg reply` frame: the largest text stdin may give, JSON-escaped.
const maxRelayFrame = maxStdin*6 + 4096

// serveRelay passes `xmsg reply` frames on as this session's replies. Only our own uid gets
// here (the directory is 0700, the socket 0600), and the peer's uid is checked once more:
// what it may do is what the uid may do anyway, reply as a session it could run itself.
func (l *listener) serveRelay(ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			cred, err := peercred.FromConn(c)
			if err != nil || int(cred.UID) != os.Getuid() {
				return // fail closed: a peer we cannot name, or another uid, gets nothing
			}
			c.SetDeadline(time.Now().Add(60 * time.Second))
			line, err := bufio.NewReader(io.LimitReader(c, maxRelayFrame)).ReadBytes('\n')
			if err != nil {
				return
			}
			var f relayFrame
			var ans replyAnswer
			if json.Unmarshal(line, &f) != nil || f.MessageID == "" || f.Text == "" {
				ans = replyAnswer{Status: "error", Error: ledger.BadRequest.String(), Detail: "want messageId and text"}
			} else if ans, err = l.reply(f.MessageID, f.Text); err != nil {
				ans = replyAnswer{Status: "error", Error: ledger.ServiceUnavailable.String(), Detail: err.Error()}
			}
			out, _ := json.Marshal(ans)
			c.Write(append(out, '\n'))
		}()
	}
}

func replyFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	regFlag := fs.String("register-sock", "", "the register.sock of the bus whose xmsg listen sessions may answer (env XMSG_REGISTER_SOCK)")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	return func(pos []string) error {
		if len(pos) != 2 {
			return usageError{"usage: xmsg reply MESSAGE_ID TEXT (TEXT \"-\" reads stdin; a TEXT that starts with \"-\" goes after --)"}
		}
		id := pos[0]
		if err := checkRef("MESSAGE_ID", id); err != nil {
			return err
		}
		text, err := readText(pos[1], s.in)
		if err != nil {
			return err
		}
		if text == "" {
			return usageError{"TEXT must not be empty"}
		}
		reg, err := sockPath("register", *regFlag)
		if err != nil {
			return err
		}
		ans, err := relayReply(relayDir(reg), id, text)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(s.out, ans)
		}
		fmt.Fprintf(s.out, "replied to %s\n", id)
		return nil
	}
}

// relayReply asks each `xmsg listen` of this bus to send the reply; the bus accepts it from
// the one that received the message and refuses the others as not_recipient.
func relayReply(dir, id, text string) (replyAnswer, error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return replyAnswer{}, exitError{exitFailure, fmt.Errorf("reply sockets: %v", err)}
	}
	frame, _ := json.Marshal(relayFrame{MessageID: id, Text: text})
	tried := 0
	for _, e := range entries {
		if e.Type() != fs.ModeSocket || !strings.HasSuffix(e.Name(), ".sock") {
			continue
		}
		ans, err := relayOne(filepath.Join(dir, e.Name()), frame)
		if err != nil {
			continue // a listen that ended without removing its socket (killed)
		}
		tried++
		switch {
		case ans.Status == "ok":
			return ans, nil
		case ans.Error == ledger.NotRecipient.String():
			continue
		}
		return ans, exitError{exitRefused, fmt.Errorf("%s: %s", ans.Error, ans.Detail)}
	}
	if tried == 0 {
		return replyAnswer{}, exitError{exitFailure, errors.New("no xmsg listen is running on this bus: only the session that received a message can reply to it (start one with xmsg listen NAME)")}
	}
	return replyAnswer{}, exitError{exitRefused, fmt.Errorf("not_recipient: none of the %d xmsg listen sessions here received message %s", tried, quoteIfOdd(id))}
}

// relayOne hands the reply to one listen's socket, and only to a process of our own uid: the
// text goes nowhere the kernel does not say is ours (SO_PEERCRED), whatever directory the
// socket was found in (a --register-sock in a shared directory, a socket planted there).
func relayOne(sock string, frame []byte) (replyAnswer, error) {
	var ans replyAnswer
	c, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return ans, err
	}
	defer c.Close()
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ans, errors.New("reply socket: not a Unix connection")
	}
	cred, err := peercred.FromConn(uc)
	if err != nil {
		return ans, err
	}
	if cred.UID != uint32(os.Geteuid()) {
		return ans, fmt.Errorf("reply socket %s is served by uid %d, not ours: skipped", sock, cred.UID)
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.Write(append(frame, '\n')); err != nil {
		return ans, err
	}
	line, err := bufio.NewReader(io.LimitReader(c, 1<<20)).ReadBytes('\n')
	if err != nil {
		return ans, err
	}
	return ans, json.Unmarshal(line, &ans)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
