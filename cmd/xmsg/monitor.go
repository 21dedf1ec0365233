package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// monitorFlags is `xmsg monitor`: it streams the running tier's message events (GET /v1/events): one line per event,
// aligned, or with --json the daemon's JSON objects. It never shows a message's text (the
// stream has none). With --count it exits 0 after that many events; when the daemon goes
// away it exits 1 with one line.
func monitorFlags(fs *flag.FlagSet, st stdio) func([]string) error {
	sock, asJSON := clientFlags(fs)
	from := fs.String("from", "", "only events whose attested sender contains this")
	to := fs.String("to", "", "only events whose recipient contains this")
	harness := fs.String("harness", "", "only events of this recipient harness")
	peer := fs.String("peer", "", "only events of this federation peer")
	event := fs.String("event", "", "only these event kinds (comma-separated: sent, refused, failed, acked, replied, reported, pulled, watched)")
	message := fs.String("message", "", "only this message and its replies")
	count := fs.Int("count", 0, "exit 0 after this many events (0: run until interrupted)")
	withText := fs.Bool("text", false, "also print each message's and reply's text where the daemon has it (audited as a watch with text)")
	since := fs.String("since", "", "first replay what the store holds from this long ago (5m) or this RFC 3339 time")
	return func(pos []string) error {
		stdout := st.out
		if len(pos) != 0 || *count < 0 {
			return usageError{"usage: xmsg monitor [--json] [--from S] [--to S] [--harness H] [--peer P] [--event K,...] [--message ID] [--count N] [--since D|TIME]"}
		}
		q := url.Values{}
		if *withText {
			q.Set("text", "1")
		}
		for k, v := range map[string]string{"from": *from, "to": *to, "harness": *harness, "peer": *peer, "event": *event, "message": *message} {
			if v != "" {
				q.Set(k, v)
			}
		}
		if *since != "" {
			at, err := parseSince(*since, time.Now())
			if err != nil {
				return usageError{"monitor: --since: " + err.Error()}
			}
			q.Set("since", at.UTC().Format(time.RFC3339Nano))
		}
		// http.sock only: the TCP listener checks no peer and never serves the stream.
		sockPath, err := httpSockPath(*sock)
		if err != nil {
			return err
		}
		c := newBusClient(sockPath)
		path := "/v1/events"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		resp, err := c.stream(path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		return printEvents(resp.Body, stdout, *asJSON, *count)
	}
}

// parseSince is a duration back from now, or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, errors.New("a duration must not be negative")
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither a duration (5m) nor an RFC 3339 time", s)
	}
	return t, nil
}

// streamEvent is a line of GET /v1/events as the monitor prints it.
type streamEvent struct {
	Time      time.Time `json:"time"`
	Event     string    `json:"event"`
	Count     uint64    `json:"count"` // "missed"
	MessageID string    `json:"message_id"`
	InReplyTo string    `json:"in_reply_to"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Harness   string    `json:"harness"`
	Transport string    `json:"transport"`
	Peer      string    `json:"peer"`
	Outcome   string    `json:"outcome"`
	Code      string    `json:"code"`
	Detail    string    `json:"detail"`
	Bytes     int       `json:"bytes"`
	Text      string    `json:"text"` // with --text, where the daemon was handed one
}

// printEvents copies the stream to out until count events were printed (then nil) or the
// stream ends (then the daemon went away: an error).
func printEvents(body io.Reader, out io.Writer, asJSON bool, count int) error {
	// A line holds one event, or with --text an event and a text JSON-escaped: up to six
	// times the text's bytes.
	r := bufio.NewReaderSize(body, 4<<20)
	w := bufio.NewWriter(out)
	defer w.Flush()
	n := 0
	for {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// Only a text makes a line this long: skip the rest rather than print half, and say so.
			for err == bufio.ErrBufferFull {
				_, err = r.ReadSlice('\n')
			}
			w.WriteString("# an event whose text is too long to show here was skipped\n")
			continue
		}
		if err != nil {
			w.Flush()
			if count > 0 && n >= count {
				return nil
			}
			return exitError{exitFailure, errors.New("monitor: the daemon went away (the event stream ended)")}
		}
		var e streamEvent
		if json.Unmarshal(line, &e) != nil {
			continue
		}
		if e.Event == "error" {
			w.Flush()
			return exitError{exitBusError, fmt.Errorf("monitor: %s: %s", e.Code, e.Detail)}
		}
		if asJSON {
			w.Write(line)
		} else {
			w.WriteString(formatEvent(&e))
		}
		if e.Event != "missed" {
			n++
		}
		// Flushed when nothing more is waiting: a batch goes out at once, a line at a time
		// only when the stream is slow.
		if r.Buffered() == 0 || (count > 0 && n >= count) {
			if w.Flush() != nil {
				return exitError{exitFailure, errors.New("monitor: cannot write the output")}
			}
		}
		if count > 0 && n >= count {
			return nil
		}
	}
}

// formatEvent is the human line of an event: time, kind, message id, sender → recipient,
// harness, transport (and peer), outcome or code, size. Names are escaped: a sender's name
// may hold any character, and a control character must not reach the terminal.
func formatEvent(e *streamEvent) string {
	if e.Event == "missed" {
		return fmt.Sprintf("# missed %d events\n", e.Count)
	}
	id := e.MessageID
	if e.Event == "replied" && e.InReplyTo != "" {
		id = "re:" + e.InReplyTo
	}
	transport := e.Transport
	if e.Peer != "" {
		transport += "/" + e.Peer
	}
	result := e.Outcome
	if e.Code != "" {
		result = e.Code
	}
	size := ""
	if e.Bytes > 0 {
		size = strconv.Itoa(e.Bytes) + "B"
	}
	line := strings.TrimRight(fmt.Sprintf("%s %-8s %-39s %-28s -> %-28s %-7s %-12s %-16s %s",
		e.Time.Local().Format("15:04:05.000"), printable(e.Event), dash(printable(id)), dash(clip(printable(e.From), 28)),
		dash(clip(printable(e.To), 28)), dash(printable(e.Harness)), dash(printable(transport)), dash(printable(result)), size), " ") + "\n"
	if e.Text != "" {
		// The text under its line, each of its lines marked, escaped as every text is shown.
		for _, l := range strings.Split(strings.TrimSuffix(escapeText(e.Text), "\n"), "\n") {
			line += "    | " + l + "\n"
		}
	}
	return line
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clip shortens s to n characters, marking the cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// printable escapes what a terminal would act on or hide: control characters (C0, DEL, C1),
// format characters such as bidirectional overrides, and invalid UTF-8, as \x.. or \u.....
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsGraphic(r) || unicode.Is(unicode.Cf, r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x80 && (r < 0x20 || r == 0x7f):
			fmt.Fprintf(&b, `\x%02x`, r)
		case !unicode.IsGraphic(r) || unicode.Is(unicode.Cf, r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// stream sends a GET whose answer is a stream and returns it once its status is 2xx; an
// error answer becomes one line with the protocol's code and the matching exit code. No
// timeout: the stream lasts as long as the caller reads it.
func (c *busClient) stream(path string) (*http.Response, error) {
	resp, err := c.http.Get(c.url(path))
	if err != nil {
		return nil, exitError{exitFailure, fmt.Errorf("cannot reach the bus at %s: %v", c.sock, unwrapURL(err))}
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return nil, answerError(resp.StatusCode, raw)
}

const monitorAbout = `Streams the running daemon's message events (GET /v1/events, on http.sock
only: the TCP listener checks no peer and refuses it): one line per event with its time, kind,
message id, attested sender, recipient, harness, transport, outcome or code and size; never
the text unless --text asks for it (then each message's or reply's text follows its line, where
the daemon was handed one as it happened, and the daemon audits the watch as "with text"). --json
prints one JSON object per line. Filters narrow what is shown; --since first replays what the
store still holds (without texts). A monitor that falls behind is told how many events it
missed; the daemon never waits for it. At most 2 monitors per process and 8 per tier
(docs/operations.md, "Watching a tier").`
