package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/limits"
)

// httpSockPath is the bus's http.sock: --http-sock, then $XMSG_HTTP_SOCK, then the default.
func httpSockPath(flagValue string) (string, error) { return sockPath("http", flagValue) }

// sockPath is one of the bus's sockets: the flag, then $XMSG_<NAME>_SOCK, then the path the
// daemon binds by default (activation.DefaultPath, the one function both sides use).
func sockPath(name, flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	if v := os.Getenv("XMSG_" + strings.ToUpper(name) + "_SOCK"); v != "" {
		return v, nil
	}
	p, err := activation.DefaultPath(name)
	if err != nil {
		return "", fmt.Errorf("%v; pass --%s-sock or set XMSG_%s_SOCK", err, name, strings.ToUpper(name))
	}
	return p, nil
}

// busClient speaks HTTP to http.sock (or, for a leaf, to its TCP listener).
type busClient struct {
	sock string
	base string // "http://localhost" on http.sock, the --url otherwise
	http *http.Client
}

// newTCPBusClient speaks to a TCP listener (a leaf's --listen), base like http://127.0.0.1:7787.
func newTCPBusClient(base string) *busClient {
	return &busClient{sock: base, base: strings.TrimRight(base, "/"), http: &http.Client{}}
}

func newBusClient(sock string) *busClient {
	return &busClient{sock: sock, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}}
}

// do sends a request and decodes a 2xx JSON answer into out. Error answers become one line
// with the protocol's code and detail, and the matching exit code.
// url is path on the bus: its TCP listener's base, or http.sock's (any host name does there).
func (c *busClient) url(path string) string {
	if c.base == "" {
		return "http://localhost" + path
	}
	return c.base + path
}

// tcpURLFlag is the --url of the commands that may ask a daemon's TCP listener (which checks
// no peer, so it serves less than http.sock) instead of its http.sock; note says what is
// particular to one command ("": nothing).
func tcpURLFlag(fs *flag.FlagSet, note string) *string {
	usage := "ask the daemon on this TCP listener instead of http.sock, e.g. http://127.0.0.1:7787 (env XMSG_URL)"
	if note != "" {
		usage += "; " + note
	}
	return fs.String("url", "", usage)
}

// httpSockFlag is every client command's --http-sock.
func httpSockFlag(fs *flag.FlagSet) *string {
	return fs.String("http-sock", "", "the bus's http.sock (env XMSG_HTTP_SOCK; default $XDG_RUNTIME_DIR/xmsg/http.sock)")
}

func (c *busClient) do(method, path string, body []byte, out any) error {
	req, err := http.NewRequest(method, c.url(path), bytes.NewReader(body))
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return exitError{exitFailure, c.unreachable(unwrapURL(err), "http.sock")}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return exitError{exitFailure, fmt.Errorf("reading the answer: %v", err)}
	}
	if resp.StatusCode >= 300 {
		return answerError(resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return exitError{exitFailure, fmt.Errorf("bad answer from the bus: %v", err)}
		}
	}
	return nil
}

// answerError is an error answer as one line with the protocol's code and detail, and the
// matching exit code.
func answerError(status int, raw []byte) error {
	var e struct{ Error, Detail string }
	json.Unmarshal(raw, &e)
	code := exitRefused
	if status >= 500 {
		code = exitBusError
	}
	if e.Error == "" {
		e.Error, e.Detail = strconv.Itoa(status), strings.TrimSpace(string(raw))
	}
	return exitError{code, fmt.Errorf("%s: %s", e.Error, e.Detail)}
}

func unwrapURL(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// clientFlags are the flags every client of http.sock takes.
func clientFlags(fs *flag.FlagSet) (sock *string, asJSON *bool) {
	sock = httpSockFlag(fs)
	asJSON = fs.Bool("json", false, "print JSON, for scripts")
	return sock, asJSON
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func listFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	sock, asJSON := clientFlags(fs)
	cwd := fs.String("cwd", "", "only sessions under this directory")
	return func(pos []string) error {
		if len(pos) > 0 {
			return usageError{"list takes no arguments (--cwd DIR narrows it)"}
		}
		path, err := httpSockPath(*sock)
		if err != nil {
			return err
		}
		var sessions []map[string]any
		q := ""
		if *cwd != "" {
			q = "?cwd=" + url.QueryEscape(*cwd)
		}
		if err := newBusClient(path).do("GET", "/v1/sessions"+q, nil, &sessions); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(s.out, sessions)
		}
		tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HARNESS\tSESSION\tNAME\tPID\tSTATUS\tCWD")
		for _, v := range sessions {
			fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\t%v\n", v["harness"], v["sessionId"], orDash(v["name"]), v["pid"], v["status"], v["cwd"])
		}
		return tw.Flush()
	}
}

func orDash(v any) any {
	if v == nil {
		return "-"
	}
	if s, ok := v.(string); ok {
		return escapeControl(s)
	}
	return v
}

func defaultFrom() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "cli " + u.Username
	}
	return "cli"
}

// maxStdin bounds what `-` reads: far above any --max-body, so that a text over the bus's
// limit is named as such instead of cut.
const maxStdin = 16 << 20

// readText is TEXT, or stdin for "-".
func readText(text string, stdin io.Reader) (string, error) {
	if text != "-" {
		return text, nil
	}
	raw, err := io.ReadAll(io.LimitReader(stdin, maxStdin+1))
	if err != nil {
		return "", fmt.Errorf("reading stdin: %v", err)
	}
	if len(raw) > maxStdin {
		return "", exitError{exitRefused, fmt.Errorf("stdin holds more than %d bytes; the bus takes a text of --max-body bytes (default %d)", maxStdin, limits.MaxBody)}
	}
	return string(raw), nil
}

// refHint says what a positional argument is, for its usage error.
var refHint = map[string]string{
	"REF":        ": a session id, pid or name (xmsg list shows them)",
	"MESSAGE_ID": ": the id xmsg send printed",
	"NAME":       ": the name others send to",
}

// checkRef refuses a target the bus could only answer with a confusing error: empty, or
// holding control characters (which a terminal would also interpret when it is echoed).
func checkRef(what, ref string) error {
	switch {
	case strings.TrimSpace(ref) == "":
		return usageError{what + " must not be empty" + refHint[what]}
	case strings.IndexFunc(ref, isControl) >= 0:
		return usageError{fmt.Sprintf("%s %s holds control characters, which no %s has", what, quoteIfOdd(ref), strings.ToLower(strings.ReplaceAll(what, "_", " ")))}
	}
	return nil
}

// checkSize refuses a text over the bus's limit before sending it: a text over the default
// limit is checked against the running daemon's (its /healthz says which), so that the
// answer names the limit instead of a broken pipe halfway through a large request.
func checkSize(c *busClient, text string) error {
	if len(text) == 0 {
		return usageError{"TEXT must not be empty"}
	}
	if len(text) <= limits.MaxBody {
		return nil
	}
	var h struct {
		MaxBody int `json:"max_body"`
	}
	max := limits.MaxBody
	if err := c.do("GET", "/healthz", nil, &h); err != nil {
		return err
	}
	if h.MaxBody > 0 {
		max = h.MaxBody
	}
	if len(text) > max {
		return exitError{exitRefused, fmt.Errorf("body_too_large: the text is %d bytes; the bus takes at most %d (its --max-body)", len(text), max)}
	}
	return nil
}

const sendAbout = `REF is a session id, a pid or a name (xmsg list shows them), or NAME@PEER for a federated
peer. The recipient sees the sender as "xmsg@HOST · cli USER" (--from changes the last part).
A TEXT that starts with "-" goes after --: xmsg send REF -- -TEXT. Prints the message id, for
xmsg replies ID.
`

func sendFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	sock, asJSON := clientFlags(fs)
	from := fs.String("from", defaultFrom(), "sender name shown to the recipient (printable ASCII, no ':' or '/')")
	key := fs.String("idempotency-key", "", "retry-safe key: the same key and text deliver once")
	return func(pos []string) error {
		if len(pos) != 2 {
			return usageError{"usage: xmsg send REF TEXT (TEXT \"-\" reads stdin; a TEXT that starts with \"-\" goes after --)"}
		}
		if err := checkRef("REF", pos[0]); err != nil {
			return err
		}
		ref := pos[0]
		text, err := readText(pos[1], s.in)
		if err != nil {
			return err
		}
		path, err := httpSockPath(*sock)
		if err != nil {
			return err
		}
		c := newBusClient(path)
		if err := checkSize(c, text); err != nil {
			return err
		}
		req := map[string]string{"from": *from, "text": text}
		if *key != "" {
			req["idempotency_key"] = *key
		}
		body, _ := json.Marshal(req)
		var d map[string]any
		if err := c.do("POST", "/v1/sessions/"+url.PathEscape(ref)+"/messages", body, &d); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(s.out, d)
		}
		fmt.Fprintf(s.out, "%v\n", d["messageId"])
		return nil
	}
}

const repliesAbout = `Replies are numbered from 1 per message and show who replied. With --wait S and no reply
yet, it waits up to S seconds (the bus waits 60 at most; a longer --wait is capped, and says
so). Exit 5 and one line when no reply came in time; exit 1 when the bus went away during the
wait.
`

// maxWait is the longest the bus holds a long-poll (docs/protocol.md §3.7).
const maxWait = 60

func repliesFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	sock, asJSON := clientFlags(fs)
	wait := fs.Int("wait", 0, "seconds to wait for a reply when there is none yet (60 at most)")
	after := fs.Uint64("after", 0, "only replies with seq greater than this")
	return func(pos []string) error {
		if len(pos) != 1 {
			return usageError{"usage: xmsg replies MESSAGE_ID [--wait S] [--after N]"}
		}
		id := pos[0]
		if err := checkRef("MESSAGE_ID", id); err != nil {
			return err
		}
		if *wait < 0 {
			return usageError{"--wait must not be negative"}
		}
		if *wait > maxWait {
			fmt.Fprintf(s.err, "xmsg: --wait %d is capped at %d s, the longest the bus waits\n", *wait, maxWait)
			*wait = maxWait
		}
		path, err := httpSockPath(*sock)
		if err != nil {
			return err
		}
		c := newBusClient(path)
		c.http.Timeout = time.Duration(*wait+30) * time.Second
		var replies []map[string]any
		q := fmt.Sprintf("/v1/messages/%s/replies?after=%d&wait=%d", url.PathEscape(id), *after, *wait)
		if err := c.do("GET", q, nil, &replies); err != nil {
			return err
		}
		if len(replies) == 0 && *wait > 0 {
			// An empty answer to a wait: the time ran out, or the daemon ended the wait because
			// it stopped. Which one is told apart by asking it again.
			if err := c.do("GET", "/healthz", nil, nil); err != nil {
				return exitError{exitFailure, fmt.Errorf("the bus went away while waiting for a reply to %s", id)}
			}
			if *asJSON {
				printJSON(s.out, replies)
			}
			return exitError{exitTimeout, fmt.Errorf("no reply to %s within %d s", id, *wait)}
		}
		if *asJSON {
			return printJSON(s.out, replies)
		}
		if len(replies) == 0 {
			fmt.Fprintf(s.err, "xmsg: no replies to %s yet (--wait S waits for one)\n", id)
			return nil
		}
		// Numbers count from 1 per message: with --after, the ones before are counted too.
		number := map[any]int{}
		all := replies
		if *after > 0 {
			all = nil
			if err := c.do("GET", fmt.Sprintf("/v1/messages/%s/replies", url.PathEscape(id)), nil, &all); err != nil {
				return err
			}
		}
		for i, r := range all {
			number[r["seq"]] = i + 1
		}
		names := sessionNames(c)
		for _, r := range replies {
			who, _ := r["replierSessionId"].(string)
			if n := names[who]; n != "" {
				who = n + " (" + who + ")"
			}
			fmt.Fprintf(s.out, "#%d %s: %s\n", number[r["seq"]], escapeControl(who), escapeText(fmt.Sprint(r["text"])))
		}
		return nil
	}
}

// sessionNames maps the live sessions' ids (bare and with their harness) to their names;
// empty when the bus cannot say.
func sessionNames(c *busClient) map[string]string {
	var sessions []struct {
		Harness   string  `json:"harness"`
		SessionID string  `json:"sessionId"`
		Name      *string `json:"name"`
	}
	out := map[string]string{}
	if c.do("GET", "/v1/sessions", nil, &sessions) != nil {
		return out
	}
	for _, v := range sessions {
		if v.Name != nil && *v.Name != "" {
			out[v.SessionID] = *v.Name
			out[v.Harness+":"+v.SessionID] = *v.Name
		}
	}
	return out
}

// escapeText is a message text for the terminal: newlines and tabs as they are, every other
// control character escaped, so that a text cannot drive the terminal it is shown on.
func escapeText(s string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		body := strings.TrimSuffix(line, "\n")
		parts := strings.Split(body, "\t")
		for i, p := range parts {
			if i > 0 {
				b.WriteByte('\t')
			}
			b.WriteString(escapeControl(p))
		}
		if len(body) < len(line) {
			b.WriteByte('\n')
		}
	}
	return b.String()
}
