package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/ostest"
)

// monitorProc is a running `xmsg monitor` whose output lines arrive on lines.
type monitorProc struct {
	cmd    *exec.Cmd
	lines  chan string
	all    []string
	stderr strings.Builder
	done   chan struct{}
}

func startMonitor(t *testing.T, d *daemon, args ...string) *monitorProc {
	t.Helper()
	m := &monitorProc{cmd: xmsgCmd(d.env, append([]string{"monitor"}, args...)...), lines: make(chan string, 1<<16), done: make(chan struct{})}
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	m.cmd.Stderr = &m.stderr
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(m.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			m.lines <- sc.Text()
		}
		close(m.lines)
	}()
	t.Cleanup(func() {
		m.cmd.Process.Kill()
		m.cmd.Wait()
	})
	return m
}

// next is the monitor's next line ("" once its output ended).
func (m *monitorProc) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-m.lines:
		if ok {
			m.all = append(m.all, l)
		}
		return l
	case <-time.After(daemontest.Wait):
		t.Fatalf("no monitor line; so far:\n%s", strings.Join(m.all, "\n"))
		return ""
	}
}

// event is the next line as JSON.
func (m *monitorProc) event(t *testing.T) map[string]any {
	t.Helper()
	l := m.next(t)
	var e map[string]any
	if err := json.Unmarshal([]byte(l), &e); err != nil {
		t.Fatalf("monitor line %q: %v", l, err)
	}
	return e
}

// metric is the value of the sample whose name and labels are exactly series in d's
// /metrics (0 when absent), with the whole exposition.
func metric(t *testing.T, d *daemon, series string) (float64, string) {
	t.Helper()
	resp, err := d.client().Get("http://localhost/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("GET /metrics: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("sample %q: %v", l, err)
			}
			return f, string(raw)
		}
	}
	return 0, string(raw)
}

// waitMonitors waits until n monitors are attached to d's tier.
func waitMonitors(t *testing.T, d *daemon, n int) {
	t.Helper()
	daemontest.WaitFor(t, fmt.Sprintf("%d monitors attached", n), func() bool {
		v, _ := metric(t, d, "xmsg_monitors")
		return int(v) == n
	})
}

func sendHTTP(t *testing.T, c *http.Client, ref, from, text string) (int, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"from": from, "text": text})
	resp, err := c.Post("http://localhost/v1/sessions/"+ref+"/messages", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		MessageID string `json:"messageId"`
	}
	json.NewDecoder(resp.Body).Decode(&v)
	return resp.StatusCode, v.MessageID
}

// TestMonitorSeesEveryTransport: a monitor sees, in the order they happen and with the
// attested sender, a send over http.sock, the ack of it over register.sock, a send and a
// reply over agent.sock; the text (a unique marker) is in none of its lines, in either form.
func TestMonitorSeesEveryTransport(t *testing.T) {
	d := newDaemon(t)
	bob := startClaude(t, d.sess, "12121212-0000-4000-8000-0000000000b0", "bob", "/")
	pi := daemontest.Start(t, "")
	pc := pi.Dial(d.sock("register"))
	if r := pi.Call(pc, map[string]any{"harness": "pi", "sessionName": "peer"}); r["status"] != "ok" {
		t.Fatalf("pi register: %v", r)
	}
	mj := startMonitor(t, d, "--json", "--event", "sent,acked,replied")
	mh := startMonitor(t, d, "--event", "sent,acked,replied")
	waitMonitors(t, d, 2)
	const marker = "MARKER-7f3a9c-secret-text"
	lastSeq := 0.0
	expect := func(kind, transport, from, id string) {
		t.Helper()
		e := mj.event(t)
		if e["event"] != kind || e["transport"] != transport || e["from"] != from || (id != "" && e["message_id"] != id && e["in_reply_to"] != id) {
			t.Fatalf("monitor: %v, want %s over %s from %s (%s)", e, kind, transport, from, id)
		}
		if seq, _ := e["seq"].(float64); seq <= lastSeq {
			t.Fatalf("seq %v after %v: out of order", seq, lastSeq)
		} else {
			lastSeq = seq
		}
		if h := mh.next(t); !strings.Contains(h, " "+kind+" ") || !strings.Contains(h, from) {
			t.Fatalf("human line %q, want %s from %s", h, kind, from)
		}
	}
	status, id1 := sendHTTP(t, d.client(), "peer", "tester", marker+" 1")
	if status != 202 {
		t.Fatalf("send: %d", status)
	}
	expect("sent", "http", "anon:tester", id1)
	pi.Send(pc, map[string]any{"action": "poll", "waitSecs": 5})
	if line, _ := pi.Recv(pc); daemontest.DeliveredID(t, line) != id1 {
		t.Fatalf("pi got %q", line)
	}
	pi.Call(pc, map[string]any{"action": "ack", "messageId": id1})
	expect("acked", "register", "pi:peer", id1)
	pa := pi.Dial(d.sock("agent"))
	r := pi.Call(pa, map[string]any{"action": "send", "ref": "bob", "text": marker + " 2"})
	if r["status"] != "ok" {
		t.Fatalf("agent send: %v", r)
	}
	bob.waitLines(t, 1)
	expect("sent", "agent", "pi:peer", field(r["delivery"], "messageId").(string))
	if r := pi.Call(pa, map[string]any{"action": "reply", "messageId": id1, "text": marker + " 3"}); r["status"] != "ok" {
		t.Fatalf("reply: %v", r)
	}
	expect("replied", "agent", "pi:peer", id1)
	for _, l := range append(mj.all, mh.all...) {
		if strings.Contains(l, "MARKER") {
			t.Fatalf("the text reached a monitor: %q", l)
		}
	}
}

// TestMonitorWithText: only a monitor that asks with --text is given texts: the send's and
// the reply's, under their events, while a monitor beside it without --text sees neither; the
// daemon audits the watch as with text. Mutants tried: every watch given texts and every item
// written with its text, both layers at once (red: the plain monitor sees the marker); the
// Watched detail always "without text" (red: no audit line).
func TestMonitorWithText(t *testing.T) {
	d := newDaemon(t)
	pi := daemontest.Start(t, "")
	pc := pi.Dial(d.sock("register"))
	if r := pi.Call(pc, map[string]any{"harness": "pi", "sessionName": "peer"}); r["status"] != "ok" {
		t.Fatalf("pi register: %v", r)
	}
	mt := startMonitor(t, d, "--json", "--text", "--event", "sent,replied")
	mp := startMonitor(t, d, "--json", "--event", "sent,replied")
	waitMonitors(t, d, 2)
	const marker = "MARKER-5b1e-text"
	status, id := sendHTTP(t, d.client(), "peer", "tester", marker+" sent")
	if status != 202 {
		t.Fatalf("send: %d", status)
	}
	pi.Send(pc, map[string]any{"action": "poll", "waitSecs": 5})
	pi.Recv(pc)
	pa := pi.Dial(d.sock("agent"))
	if r := pi.Call(pa, map[string]any{"action": "reply", "messageId": id, "text": marker + " replied"}); r["status"] != "ok" {
		t.Fatalf("reply: %v", r)
	}
	for _, want := range []string{marker + " sent", marker + " replied"} {
		if e := mt.event(t); e["text"] != want {
			t.Fatalf("the --text monitor: %v, want text %q", e, want)
		}
	}
	mp.event(t)
	mp.event(t)
	for _, l := range mp.all {
		if strings.Contains(l, "MARKER") {
			t.Fatalf("a monitor without --text was given a text: %q", l)
		}
	}
	daemontest.WaitFor(t, "the audit line of a watch with text", func() bool {
		return strings.Contains(d.stderr.String(), `msg=watching`) && strings.Contains(d.stderr.String(), `detail="with text"`)
	})
}

// TestMonitorStoppedNeverBlocksSends: a monitor that attached and then never reads holds no
// send up: 6000 refusals are answered while its socket and ring are full, and when it reads
// again it is told how many events it missed, then sees new ones.
func TestMonitorStoppedNeverBlocksSends(t *testing.T) {
	d := newDaemon(t)
	c, err := net.Dial("unix", d.sock("http"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /v1/events?event=refused HTTP/1.1\r\nHost: localhost\r\n\r\n")
	waitMonitors(t, d, 1)
	client := d.client()
	const n = 6000 // more than the ring (4096) and the socket buffers hold
	for i := range n {
		if status, _ := sendHTTP(t, client, "nobody", fmt.Sprint("s", i), "x"); status != 404 {
			t.Fatalf("send %d: %d, want 404", i, status)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("GET /v1/events: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	seen, missed := 0, 0
	sendLast := false
	for sc.Scan() {
		var e struct {
			Event string `json:"event"`
			Count int    `json:"count"`
			From  string `json:"from"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		switch {
		case e.Event == "missed":
			missed += e.Count
		case e.From == "anon:last":
			if missed == 0 || seen+missed != n {
				t.Fatalf("saw %d and missed %d of %d events", seen, missed, n)
			}
			return
		default:
			seen++
		}
		if seen+missed == n && !sendLast {
			sendLast = true
			sendHTTP(t, client, "nobody", "last", "x")
		}
	}
	t.Fatalf("stream ended: %v (saw %d, missed %d)", sc.Err(), seen, missed)
}

// TestMonitorSinceHasNoSeam: --since replays what the store holds, then goes live, while
// sends go on the whole time: every message appears exactly once.
func TestMonitorSinceHasNoSeam(t *testing.T) {
	d := newDaemon(t)
	startClaude(t, d.sess, "12121212-0000-4000-8000-0000000000b1", "bob", "/")
	client := d.client()
	var mu sync.Mutex
	var ids []string
	send := func(text string) string {
		status, id := sendHTTP(t, client, "bob", "seam", text)
		if status != 202 {
			t.Errorf("send: %d", status)
		}
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
		return id
	}
	for i := range 20 {
		send(fmt.Sprint("before ", i))
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		c := d.client()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			status, id := sendHTTP(t, c, "bob", "seam", fmt.Sprint("during ", i))
			if status != 202 {
				t.Errorf("send: %d", status)
				return
			}
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
		}
	}()
	m := startMonitor(t, d, "--json", "--since", "1h", "--event", "sent")
	waitMonitors(t, d, 1)
	// Some sends after the monitor attached, then the last one.
	for range 20 {
		send("after")
	}
	close(stop)
	<-stopped
	send("last")
	// Read until every message sent has been shown. Not only until the last one: a send's
	// event is emitted once its answer is out, so the last send of the goroutine above may
	// be announced after the one sent after it.
	mu.Lock()
	defer mu.Unlock()
	count := map[string]int{}
	for missing := len(ids); missing > 0; {
		e := m.event(t)
		id, _ := e["message_id"].(string)
		if count[id]++; count[id] == 1 && slices.Contains(ids, id) {
			missing--
		}
	}
	for _, id := range ids {
		if count[id] != 1 {
			t.Errorf("message %s shown %d times", id, count[id])
		}
	}
	if len(count) != len(ids) {
		t.Errorf("%d messages shown, %d sent", len(count), len(ids))
	}
	t.Logf("%d messages across the seam", len(ids))
}

// TestMonitorBoundsAndEnd: one process holds at most two monitors (the third is answered
// 503 naming the bound); a monitor whose daemon stops exits 1 with one line; --count exits 0.
func TestMonitorBoundsAndEnd(t *testing.T) {
	d := newDaemon(t)
	var bodies []io.Closer
	for i := range 3 {
		resp, err := d.client().Get("http://localhost/v1/events")
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, resp.Body)
		if i < 2 && resp.StatusCode != 200 {
			t.Fatalf("monitor %d: %d", i, resp.StatusCode)
		}
		if i == 2 {
			if resp.StatusCode != 503 {
				t.Fatalf("third monitor of one process: %d, want 503", resp.StatusCode)
			}
			raw, _ := io.ReadAll(resp.Body)
			if !strings.Contains(string(raw), `"service_unavailable"`) || !strings.Contains(string(raw), "limit 2") {
				t.Fatalf("third monitor of one process: %d %s", resp.StatusCode, raw)
			}
		}
	}
	for _, b := range bodies {
		b.Close()
	}
	waitMonitors(t, d, 0)
	counted := startMonitor(t, d, "--count", "1", "--event", "refused")
	ended := startMonitor(t, d)
	waitMonitors(t, d, 2)
	sendHTTP(t, d.client(), "nobody", "x", "x")
	<-counted.done
	if err := counted.cmd.Wait(); err != nil {
		t.Fatalf("--count 1: %v %s", err, counted.stderr.String())
	}
	d.stop()
	<-ended.done
	err := ended.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitFailure || strings.Count(ended.stderr.String(), "\n") != 1 ||
		!strings.Contains(ended.stderr.String(), "went away") {
		t.Fatalf("monitor after the daemon stopped: %v %q", err, ended.stderr.String())
	}
}

// TestMetricsScrape: /metrics passes `promtool check metrics`, its send counter moves with
// sends, and 10,000 distinct anonymous senders do not add a series.
func TestMetricsScrape(t *testing.T) {
	d := newDaemon(t)
	startClaude(t, d.sess, "12121212-0000-4000-8000-0000000000b2", "bob", "/")
	const sent = `xmsg_events_total{event="sent",transport="http",harness="claude",peer="",outcome="delivered",code=""}`
	client := d.client()
	for i := range 20 {
		if status, _ := sendHTTP(t, client, "bob", "alice", fmt.Sprint("hello ", i)); status != 202 {
			t.Fatalf("send: %d", status)
		}
	}
	// A send's event follows its answer: wait for the count rather than read it once.
	var before string
	daemontest.WaitFor(t, "20 sends counted", func() bool {
		var v float64
		v, before = metric(t, d, sent)
		return v == 20
	})
	if b, _ := metric(t, d, `xmsg_event_bytes_total{event="sent",transport="http",harness="claude",peer="",outcome="delivered",code=""}`); b <= 0 {
		t.Errorf("no bytes counted")
	}
	promtool(t, before)
	// Every commit the sends made is in the histogram, and its +Inf bucket is its count.
	if n, _ := metric(t, d, "xmsg_store_commit_duration_seconds_count"); n < 1 {
		t.Errorf("%v commits timed after 20 sends", n)
	} else if inf, _ := metric(t, d, `xmsg_store_commit_duration_seconds_bucket{le="+Inf"}`); inf < n {
		t.Errorf("+Inf bucket %v below the count %v", inf, n)
	}
	if c, raw := metric(t, d, `xmsg_connections{socket="register"}`); c != 0 || !strings.Contains(raw, `xmsg_connections{socket="register"} `) {
		t.Errorf("register.sock connections %v with none open, or not reported", c)
	}
	const senders = 10_000
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := d.client()
			for i := w; i < senders; i += 16 {
				if status, _ := sendHTTP(t, c, "bob", fmt.Sprintf("sender-%d", i), "x"); status != 202 {
					t.Errorf("send: %d", status)
					return
				}
			}
		}()
	}
	wg.Wait()
	var after string
	daemontest.WaitFor(t, "every send counted", func() bool {
		var v float64
		v, after = metric(t, d, sent)
		return v == 20+senders
	})
	if a, b := seriesCount(after), seriesCount(before); a != b {
		t.Errorf("%d series after %d distinct senders, %d before:\n%s", a, senders, b, after)
	}
	if strings.Contains(after, "sender-") {
		t.Error("a sender's name is a label value")
	}
	promtool(t, after)
}

var sampleLine = regexp.MustCompile(`^[a-z_]+(\{.*\})? \S+$`)

func seriesCount(expo string) int {
	n := 0
	for _, l := range strings.Split(expo, "\n") {
		if sampleLine.MatchString(l) {
			n++
		}
	}
	return n
}

// promtool runs `promtool check metrics` on an exposition: needed in CI, skipped elsewhere
// when promtool is not installed.
func promtool(t *testing.T, expo string) {
	t.Helper()
	tool := ostest.RequireTool(t, "promtool")
	cmd := exec.Command(tool, "check", "metrics")
	cmd.Stdin = strings.NewReader(expo)
	if out, err := cmd.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s\n%s", err, out, expo)
	}
}

// TestStatusFollowsAMessage: `xmsg status ID` shows a message's life from the store;
// with --wait it follows it until the reply, prints the reply, and exits 0; `xmsg doctor` names the running tier's monitors.
func TestStatusFollowsAMessage(t *testing.T) {
	d := newDaemon(t)
	pi := daemontest.Start(t, "")
	pc := pi.Dial(d.sock("register"))
	if r := pi.Call(pc, map[string]any{"harness": "pi", "sessionName": "peer"}); r["status"] != "ok" {
		t.Fatalf("pi register: %v", r)
	}
	_, id := sendHTTP(t, d.client(), "peer", "tester", "hello")
	out, err := xmsgCmd(d.env, "status", id).Output()
	if err != nil || !strings.Contains(string(out), "sent     from xmsg@testhost · tester to pi:") || !strings.Contains(string(out), "(as recorded now)") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	wait := xmsgCmd(d.env, "status", id, "--wait", "60")
	var waitOut strings.Builder
	wait.Stdout = &waitOut
	if err := wait.Start(); err != nil {
		t.Fatal(err)
	}
	pi.Send(pc, map[string]any{"action": "poll", "waitSecs": 5})
	pi.Recv(pc)
	pi.Call(pc, map[string]any{"action": "ack", "messageId": id})
	pa := pi.Dial(d.sock("agent"))
	if r := pi.Call(pa, map[string]any{"action": "reply", "messageId": id, "text": "done"}); r["status"] != "ok" {
		t.Fatalf("reply: %v", r)
	}
	if err := wait.Wait(); err != nil || !strings.Contains(waitOut.String(), "replied  #1 by pi:") {
		t.Fatalf("status --wait: %v\n%s", err, waitOut.String())
	}
	out, _ = xmsgCmd(d.env, "doctor").Output()
	for _, want := range []string{"running: version", "sessions: pi 1", "monitors: 0 attached (limit 8)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("doctor lacks %q:\n%s", want, out)
		}
	}
}

// TestMetricsQueueAge: a configured service that is not connected holds what is sent to it;
// the scrape names its queue's depth and the age of its oldest message, and both are 0 for an
// empty queue. Mutant tried: the age never filled in (red: the family is missing).
func TestMetricsQueueAge(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, "--svc-exe", "late="+self, "--svc-exe", "idle="+self)
	if status, _ := sendHTTP(t, d.client(), "svc:late", "tester", "waiting"); status != 202 {
		t.Fatalf("send to the unconnected service: %d", status)
	}
	if v, raw := metric(t, d, `xmsg_queue_depth{service="late"}`); v != 1 {
		t.Fatalf("depth %v, want 1:\n%s", v, raw)
	}
	_, raw := metric(t, d, "xmsg_build_info")
	for _, want := range []string{`xmsg_queue_oldest_age_seconds{service="late"} `, `xmsg_queue_oldest_age_seconds{service="idle"} 0`} {
		if !strings.Contains(raw, want) {
			t.Errorf("scrape lacks %q:\n%s", want, raw)
		}
	}
	promtool(t, raw)
}
