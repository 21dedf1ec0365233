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
func (c *busClient) do(method, path string, body []byte, out any) error {
	base := c.base
	if base == "" {
		base = "http://localhost"
	}
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return exitError{exitFailure, fmt.Errorf("cannot reach the bus at %s: %v", c.sock, unwrapURL(err))}
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

func clientFlags(name string) (*flag.FlagSet, *string, *bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	sock := fs.String("http-sock", "", "bus http.sock path (env XMSG_HTTP_SOCK)")
	asJSON := fs.Bool("json", false, "print JSON")
	return fs, sock, asJSON
}

// parseInterleaved parses flags that may come before or after positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usageError{fmt.Sprintf("%s: %v", fs.Name(), err)}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func listCmd(args []string, stdout io.Writer) error {
	fs, sock, asJSON := clientFlags("list")
	cwd := fs.String("cwd", "", "only sessions under this directory")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{"list takes no arguments"}
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
		return printJSON(stdout, sessions)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HARNESS\tSESSION\tNAME\tPID\tSTATUS\tCWD")
	for _, s := range sessions {
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\t%v\n", s["harness"], s["sessionId"], orDash(s["name"]), s["pid"], s["status"], s["cwd"])
	}
	return tw.Flush()
}

func orDash(v any) any {
	if v == nil {
		return "-"
	}
	return v
}

func defaultFrom() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "cli " + u.Username
	}
	return "cli"
}

func sendCmd(args []string, stdin io.Reader, stdout io.Writer) error {
	fs, sock, asJSON := clientFlags("send")
	from := fs.String("from", defaultFrom(), "sender name shown to the recipient (printable ASCII, no ':' or '/')")
	key := fs.String("idempotency-key", "", "retry-safe key: the same key and text deliver once")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError{"usage: xmsg send REF TEXT   (TEXT \"-\" reads stdin)"}
	}
	ref, text := pos[0], pos[1]
	if text == "-" {
		raw, err := io.ReadAll(io.LimitReader(stdin, 16<<20))
		if err != nil {
			return fmt.Errorf("reading stdin: %v", err)
		}
		text = string(raw)
	}
	body, _ := json.Marshal(map[string]string{"from": *from, "text": text, "idempotency_key": *key})
	if *key == "" {
		body, _ = json.Marshal(map[string]string{"from": *from, "text": text})
	}
	path, err := httpSockPath(*sock)
	if err != nil {
		return err
	}
	var d map[string]any
	if err := newBusClient(path).do("POST", "/v1/sessions/"+url.PathEscape(ref)+"/messages", body, &d); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, d)
	}
	fmt.Fprintf(stdout, "%v\n", d["messageId"])
	return nil
}

func repliesCmd(args []string, stdout io.Writer) error {
	fs, sock, asJSON := clientFlags("replies")
	wait := fs.Int("wait", 0, "seconds to wait for a reply when there is none yet (max 60)")
	after := fs.Uint64("after", 0, "only replies with seq greater than this")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError{"usage: xmsg replies MESSAGE_ID [--wait S] [--after N]"}
	}
	if *wait < 0 {
		return usageError{"--wait must not be negative"}
	}
	path, err := httpSockPath(*sock)
	if err != nil {
		return err
	}
	c := newBusClient(path)
	c.http.Timeout = time.Duration(*wait+30) * time.Second
	var replies []map[string]any
	q := fmt.Sprintf("/v1/messages/%s/replies?after=%d&wait=%d", url.PathEscape(pos[0]), *after, *wait)
	if err := c.do("GET", q, nil, &replies); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, replies)
	}
	for _, r := range replies {
		fmt.Fprintf(stdout, "#%v %v: %v\n", r["seq"], r["replierSessionId"], r["text"])
	}
	return nil
}
