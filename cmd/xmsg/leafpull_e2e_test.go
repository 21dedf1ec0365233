//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/fed/fedtest"
	"github.com/xmsg/xmsg/internal/ostest"
)

// Batched leaf pulls and fair shares, end to end (issues 22 and 18): a hub daemon and a leaf
// daemon (the real binary, each its own user and network namespace, real mTLS), a service
// draining its queue (a separate process on a register socket), senders and federation peers
// as separate processes. The figures are printed, not asserted (the machine is shared); what
// is asserted is that everything arrives once, that the inbox path is not rate-limited, that
// a flooding peer leaves a second peer its place, and that a leaf's mailbox stays bounded.

func init() {
	leafRoles["leafdrain"] = func() int { leafRoleDrain(); return 0 }
	leafRoles["leafsend"] = func() int { leafRoleSend(); return 0 }
	leafRoles["fedsend"] = func() int { leafRoleFedSend(); return 0 }
}

// drainResult is what the drain role reports: messages received once, duplicates, the first
// and last receive time, and each message's latency from its send (ns).
type drainResult struct {
	N, Dups     int
	First, Last int64
	Lat         []int64
	Err         string
}

// leafRoleDrain is a service: it registers with $FIRST on the register socket $SOCK, prints
// the answer, then polls and acks (after $DELAY, if set) until it holds $N distinct messages
// or none came for $IDLE seconds, and prints a drainResult. A message's text starts "t=<unix ns of its send> ".
func leafRoleDrain() {
	c, err := net.Dial("unix", os.Getenv("SOCK"))
	if err != nil {
		fmt.Printf("{\"err\":%q}\n", err.Error())
		return
	}
	r := bufio.NewReaderSize(c, 1<<20)
	trip := func(line string) (string, error) {
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			return "", err
		}
		return r.ReadString('\n')
	}
	first, err := trip(os.Getenv("FIRST"))
	if err != nil {
		fmt.Printf("{\"err\":%q}\n", err.Error())
		return
	}
	fmt.Print(first)
	n, _ := strconv.Atoi(os.Getenv("N"))
	idleSecs, _ := strconv.Atoi(os.Getenv("IDLE"))
	idle := time.Duration(idleSecs) * time.Second
	delay, _ := time.ParseDuration(os.Getenv("DELAY")) // per message: a slow service
	seen := map[string]bool{}
	var res drainResult
	last := time.Now()
	for len(seen) < n && time.Since(last) < idle {
		out, err := trip(`{"action":"poll","waitSecs":1}`)
		if err != nil {
			res.Err = err.Error()
			break
		}
		var m struct{ Action, MessageID, Text string }
		json.Unmarshal([]byte(out), &m)
		if m.Action == "timeout" {
			continue
		}
		if m.Action != "deliver" {
			res.Err = strings.TrimSpace(out)
			break
		}
		now := time.Now().UnixNano()
		if seen[m.MessageID] {
			res.Dups++
		} else {
			seen[m.MessageID] = true
			if ts, ok := strings.CutPrefix(m.Text, "t="); ok {
				ts, _, _ = strings.Cut(ts, " ")
				if sent, err := strconv.ParseInt(ts, 10, 64); err == nil {
					res.Lat = append(res.Lat, now-sent)
				}
			}
		}
		if res.First == 0 {
			res.First = now
		}
		res.Last, last = now, time.Now()
		time.Sleep(delay)
		if _, err := trip(`{"action":"ack","messageId":"` + m.MessageID + `"}`); err != nil {
			res.Err = err.Error()
			break
		}
	}
	res.N = len(seen)
	raw, _ := json.Marshal(res)
	fmt.Println(string(raw))
}

// sendResult is what a sender reports: accepted sends, refusals (503, retried unless
// $NORETRY), other failures, the last refusal's detail, and (paced senders) each accepted
// send's answer time.
type sendResult struct {
	Sent, Refused, Other int
	Detail               string
	Lat                  []int64
}

// leafRoleSend sends $N messages to $REF through the HTTP socket $SOCK from $C connections
// ($RATE a second in all when set), each text "t=<unix ns> i=<k> " padded to $SIZE bytes,
// retrying a 503 after 1 ms unless $NORETRY; it prints a sendResult.
func leafRoleSend() {
	n, _ := strconv.Atoi(os.Getenv("N"))
	conc, _ := strconv.Atoi(os.Getenv("C"))
	rate, _ := strconv.Atoi(os.Getenv("RATE"))
	size, _ := strconv.Atoi(os.Getenv("SIZE"))
	noRetry := os.Getenv("NORETRY") != ""
	sock, path := os.Getenv("SOCK"), "/v1/sessions/"+os.Getenv("REF")+"/messages"
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conc,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	jobs := make(chan int)
	go func() {
		var tick *time.Ticker
		if rate > 0 {
			tick = time.NewTicker(time.Second / time.Duration(rate))
			defer tick.Stop()
		}
		for i := range n {
			if tick != nil {
				<-tick.C
			}
			jobs <- i
		}
		close(jobs)
	}()
	var mu sync.Mutex
	var res sendResult
	var wg sync.WaitGroup
	for range max(conc, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				for tries := 0; ; tries++ {
					start := time.Now()
					text := fmt.Sprintf("t=%d i=%d ", start.UnixNano(), i)
					if len(text) < size {
						text += strings.Repeat("x", size-len(text))
					}
					body, _ := json.Marshal(map[string]string{"from": "bench", "text": text})
					resp, err := c.Post("http://localhost"+path, "application/json", bytes.NewReader(body))
					status, detail := 0, ""
					if err == nil {
						raw, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						status, detail = resp.StatusCode, string(raw)
					} else {
						detail = err.Error()
					}
					mu.Lock()
					switch {
					case status == http.StatusAccepted:
						res.Sent++
						if rate > 0 {
							res.Lat = append(res.Lat, int64(time.Since(start)))
						}
					case status == http.StatusServiceUnavailable:
						res.Refused++
						res.Detail = detail
					default:
						res.Other++
						res.Detail = detail
					}
					mu.Unlock()
					if status == http.StatusAccepted || noRetry || (status != http.StatusServiceUnavailable && tries > 5) {
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	raw, _ := json.Marshal(res)
	fmt.Println(string(raw))
}

// leafRoleFedSend is a pinned federation peer ($CERT, $KEY) posting envelopes to $REF on the
// federation listener $ADDR for $DUR seconds from $C connections: MODE=flood as fast as it
// can, a new anonymous principal each time; MODE=paced $RATE a second as one session. It
// never retries, and prints a sendResult (Refused counts 503s, Lat the paced answer times).
func leafRoleFedSend() {
	pair, err := tls.LoadX509KeyPair(os.Getenv("CERT"), os.Getenv("KEY"))
	if err != nil {
		fmt.Printf("{\"err\":%q}\n", err.Error())
		return
	}
	conc, _ := strconv.Atoi(os.Getenv("C"))
	rate, _ := strconv.Atoi(os.Getenv("RATE"))
	dur, _ := strconv.Atoi(os.Getenv("DUR"))
	flood := os.Getenv("MODE") == "flood"
	c := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: max(conc, 1),
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}}
	end := time.Now().Add(time.Duration(dur) * time.Second)
	var mu sync.Mutex
	var res sendResult
	var seq atomic.Int64
	var wg sync.WaitGroup
	for range max(conc, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now()
			for time.Now().Before(end) {
				if rate > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(time.Duration(max(conc, 1)) * time.Second / time.Duration(rate))
				}
				k := seq.Add(1)
				id := uuid.Must(uuid.NewV7()).String()
				principal := map[string]any{"kind": "session", "harness": "claude", "session_id": "good", "name": "good"}
				if flood {
					principal = map[string]any{"kind": "anonymous", "from": fmt.Sprintf("flood%d", k)}
				}
				body, _ := json.Marshal(map[string]any{"v": 2, "id": id, "principal": principal, "to": map[string]any{"ref": os.Getenv("REF")},
					"body": fmt.Sprintf("t=%d k=%d", time.Now().UnixNano(), k), "push_replies": false, "thread_id": id, "created_at": time.Now().Unix()})
				start := time.Now()
				resp, err := c.Post("https://"+os.Getenv("ADDR")+"/fed/v2/messages", "application/json", bytes.NewReader(body))
				status, detail := 0, ""
				if err == nil {
					raw, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					status, detail = resp.StatusCode, string(raw)
				} else {
					detail = err.Error()
				}
				mu.Lock()
				switch status {
				case http.StatusAccepted:
					res.Sent++
					if !flood {
						res.Lat = append(res.Lat, int64(time.Since(start)))
					}
				case http.StatusServiceUnavailable:
					res.Refused++
					res.Detail = detail
				default:
					res.Other++
					res.Detail = detail
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	raw, _ := json.Marshal(res)
	fmt.Println(string(raw))
}

// pullSetup is leafSetup's cast with the hub at its default limits, svc:bot also a local
// service of the hub (for the same-run baseline), and two pinned peers for the flood.
type pullSetup struct {
	*leafSetup
	p1, p2  *fedtest.Cert
	hubArgs []string
}

func newPullSetup(t *testing.T) *pullSetup {
	ostest.RequireRoot(t)
	for _, tool := range []string{"ip", "nsenter", "setpriv", "useradd"} {
		ostest.RequireTool(t, tool)
	}
	s := &pullSetup{leafSetup: &leafSetup{t: t, net: newNetPair(t)}}
	_, s.exe = ostest.WorldExe(t, "xmsg-leafpull-test")
	s.hub = newLnode(t, "hub", s.net.a, s.exe)
	s.leaf = newLnode(t, "leaf1", s.net.b, s.exe)
	s.leaf2 = fedtest.New(t, "leaf2", nil, fedtest.Options{})
	s.p1 = fedtest.New(t, "p1", nil, fedtest.Options{})
	s.p2 = fedtest.New(t, "p2", nil, fedtest.Options{})
	for name, c := range map[string]*fedtest.Cert{"p1": s.p1, "p2": s.p2} {
		s.leaf.file(name+".cert.pem", c.CertPEM)
		s.leaf.file(name+".key.pem", c.KeyPEM)
	}
	s.hub.file("peers.json", []byte(fmt.Sprintf(`{
		"leaf1": {"address": "192.0.2.2:1", "pin": %q, "leaf": true, "allow": ["send", "reply"], "from": ["192.0.2.2/32"]},
		"leaf2": {"address": "192.0.2.3:1", "pin": %q, "leaf": true, "allow": ["send", "reply"]},
		"p1": {"address": "192.0.2.2:2", "pin": %q, "allow": ["send"]},
		"p2": {"address": "192.0.2.2:3", "pin": %q, "allow": ["send"]}}`, s.leaf.cert.Pin, s.leaf2.Pin, s.p1.Pin, s.p2.Pin)))
	s.leafCreds = leafSecretVolume(t, s.leaf, map[string][]byte{"fed-cert": s.leaf.cert.CertPEM, "fed-key": s.leaf.cert.KeyPEM,
		"peers": []byte(fmt.Sprintf(`{"hub": {"address": "192.0.2.1:7443", "pin": %q}}`, s.hub.cert.Pin))})
	// Default limits: no --fed-rate-*, no mailbox or share flags.
	s.hubArgs = []string{"serve", "--sessions-dir", s.hub.path("sessions"), "--fed-listen", "192.0.2.1:7443", "--svc-exe", "bot=" + s.exe,
		"--db-path", s.hub.path("state/xmsg.db"), "--peers-file", s.hub.path("peers.json"), "--fed-cert", s.hub.path("cert.pem"),
		"--fed-key", s.hub.path("key.pem"), "--fed-reload-interval-secs", "0", "--host-label", "hub"}
	s.hub.args = s.hubArgs
	s.regSock = s.leaf.path("rt/xmsg/register.sock")
	s.leaf.args = []string{"serve", "--leaf", "--leaf-principal", "svc:bot", "--listen", "127.0.0.1:7787",
		"--db-path", s.leaf.path("state/xmsg.db"), "--fed-reload-interval-secs", "0", "--host-label", s.leaf.name}
	s.leaf.extraEnv = []string{"CREDENTIALS_DIRECTORY=" + s.leafCreds}
	s.hub.start()
	t.Cleanup(s.hub.stop)
	s.leaf.start()
	t.Cleanup(s.leaf.stop)
	return s
}

// restartHub restarts the hub with extra flags on top of its defaults.
func (s *pullSetup) restartHub(extra ...string) {
	s.hub.stop()
	s.hub.args = append(slices.Clone(s.hubArgs), extra...)
	s.hub.start()
}

// drain starts a service draining svc:bot on sock as u (in no namespace): n messages, or
// until idle seconds pass without one.
func (s *pullSetup) drain(u ostest.User, sock string, n, idle int, env ...string) *lhelper {
	s.t.Helper()
	h := startHelper(s.t, "drain", userCmd(u, "", s.exe, append([]string{ostest.Role("leafdrain"), "SOCK=" + sock, `FIRST={"harness":"svc","name":"bot"}`,
		"N=" + strconv.Itoa(n), "IDLE=" + strconv.Itoa(idle)}, env...)), true)
	if !strings.Contains(h.first, `"sessionId":"svc:bot"`) {
		s.t.Fatalf("drain registration: %s\nhub: %s\nleaf: %s", h.first, s.hub.stderr, s.leaf.stderr)
	}
	return h
}

// send starts a sender on the hub's http.sock.
func (s *pullSetup) send(ref string, env ...string) *lhelper {
	return startHelper(s.t, "send", userCmd(s.hub.user, "", s.exe, append([]string{ostest.Role("leafsend"), "SOCK=" + s.hub.path("rt/xmsg/http.sock"),
		"REF=" + ref}, env...)), false)
}

// fedSend starts peer name (p1, p2) sending from the leaf's namespace.
func (s *pullSetup) fedSend(name string, env ...string) *lhelper {
	return startHelper(s.t, name, userCmd(s.leaf.user, s.net.b, s.exe, append([]string{ostest.Role("fedsend"), "ADDR=192.0.2.1:7443",
		"CERT=" + s.leaf.path(name+".cert.pem"), "KEY=" + s.leaf.path(name+".key.pem")}, env...)), false)
}

func result[T any](t *testing.T, h *lhelper) T {
	t.Helper()
	var v T
	l := h.next()
	if err := json.Unmarshal([]byte(l), &v); err != nil {
		t.Fatalf("%s: %q", h.name, l)
	}
	return v
}

func nsQuantile(ns []int64, q float64) time.Duration {
	if len(ns) == 0 {
		return 0
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	return time.Duration(s[min(len(s)-1, int(q*float64(len(s))))])
}

// path is one drain: n messages from 4 senders retrying on 503, to ref, drained by a
// service on sock; it returns the drain rate and the send → service p50/p99.
func (s *pullSetup) path(t *testing.T, u ostest.User, sock, ref string, n int, env ...string) (float64, time.Duration, time.Duration) {
	t.Helper()
	d := s.drain(u, sock, n, 20)
	snd := s.send(ref, append([]string{"N=" + strconv.Itoa(n)}, env...)...)
	sr := result[sendResult](t, snd)
	dr := result[drainResult](t, d)
	if sr.Sent != n || dr.N != n || dr.Dups != 0 || dr.Err != "" {
		t.Fatalf("%s: sent %d (refused %d, other %d: %s), received %d once, %d twice, err %q\nhub: %s\nleaf: %s",
			ref, sr.Sent, sr.Refused, sr.Other, sr.Detail, dr.N, dr.Dups, dr.Err, s.hub.stderr, s.leaf.stderr)
	}
	rate := float64(n-1) / time.Duration(dr.Last-dr.First).Seconds()
	return rate, nsQuantile(dr.Lat, 0.5), nsQuantile(dr.Lat, 0.99)
}

// TestLeafPullFigures: one leaf with default limits drains a backlog (4 senders on the hub
// keeping its mailbox full), against the same service draining the same backlog on the hub
// itself, and the send → service latency of both at a light paced load. Then a pinned peer
// floods svc:bot while a second peer sends at 50/s (both within their rate limits: the hub
// is restarted with the rates out of the way, so that the flood fills its share in a second
// instead of a minute) and the service drains 200/s, with the share on and, as the positive
// control, off by its flag. Then
// 60 KB sends to a leaf nobody pulls: the mailbox bound holds. Short by default; XMSG_LONG=1
// drains 10,000.
func TestLeafPullFigures(t *testing.T) {
	s := newPullSetup(t)
	n, paced := 4000, 200
	if long() {
		n, paced = 10000, 1000
	}
	hubReg := s.hub.path("rt/xmsg/register.sock")

	localRate, localP50, localP99 := s.path(t, s.hub.user, hubReg, "svc:bot", n, "C=4")
	leafRate, leafP50, leafP99 := s.path(t, s.leaf.user, s.regSock, "svc:bot@leaf1", n, "C=4")
	_, lp50, lp99 := s.path(t, s.hub.user, hubReg, "svc:bot", paced, "C=1", "RATE=100")
	_, fp50, fp99 := s.path(t, s.leaf.user, s.regSock, "svc:bot@leaf1", paced, "C=1", "RATE=100")
	goal := min(1000, localRate/2)
	t.Logf("drain of %d messages, 4 senders retrying on 503 (figures taken once, on a 2-CPU machine shared with other work):", n)
	t.Logf("  local svc:bot on the hub: %6.0f msg/s, send → service p50 %v p99 %v", localRate, localP50.Round(time.Millisecond), localP99.Round(time.Millisecond))
	t.Logf("  hub → leaf → svc:bot:     %6.0f msg/s, send → service p50 %v p99 %v (goal ≥ %.0f msg/s: met %v)", leafRate, leafP50.Round(time.Millisecond), leafP99.Round(time.Millisecond), goal, leafRate >= goal)
	t.Logf("paced, 100 msg/s, %d messages: local p50 %v p99 %v; through the leaf p50 %v p99 %v", paced,
		lp50.Round(100*time.Microsecond), lp99.Round(100*time.Microsecond), fp50.Round(100*time.Microsecond), fp99.Round(100*time.Microsecond))
	// 4,000 messages take more than 60 pulls (the peer rate's burst) of at most 50 rows: none
	// of them may be refused for the rate.
	if strings.Contains(s.leaf.stderr.String(), "rate_limited") {
		t.Errorf("the leaf's pulls were rate-limited:\n%s", s.leaf.stderr)
	}

	// The flood (issue 18).
	flood := func(extra ...string) (good, bad sendResult) {
		s.restartHub(append([]string{"--fed-rate-peer", "1000000", "--fed-rate-principal", "1000000"}, extra...)...)
		dur := "3"
		if long() {
			dur = "20"
		}
		// A service slower than the flood (200 msg/s), so that the flood keeps the queue full.
		d := s.drain(s.hub.user, hubReg, 1<<30, 3, "DELAY=5ms")
		p1 := s.fedSend("p1", "REF=svc:bot", "MODE=flood", "C=4", "DUR="+dur)
		time.Sleep(500 * time.Millisecond) // the flood first: the queue is full when p2 starts
		p2 := s.fedSend("p2", "REF=svc:bot", "MODE=paced", "C=1", "RATE=50", "DUR="+dur)
		bad, good = result[sendResult](t, p1), result[sendResult](t, p2)
		d.close()
		return good, bad
	}
	good, bad := flood()
	goodOff, badOff := flood("--queue-max-per-origin", "0")
	pct := func(r sendResult) float64 { return 100 * float64(r.Sent) / float64(max(1, r.Sent+r.Refused+r.Other)) }
	t.Logf("flood of svc:bot by p1 (new principal per request, 4 connections) with p2 sending 50/s:")
	t.Logf("  share %d per origin: p2 %d of %d accepted (%.1f %%, p99 %v); p1 %d accepted, %d refused",
		50, good.Sent, good.Sent+good.Refused+good.Other, pct(good), nsQuantile(good.Lat, 0.99).Round(100*time.Microsecond), bad.Sent, bad.Refused)
	t.Logf("  --queue-max-per-origin 0 (control): p2 %d of %d accepted (%.1f %%); p1 %d accepted, %d refused",
		goodOff.Sent, goodOff.Sent+goodOff.Refused+goodOff.Other, pct(goodOff), badOff.Sent, badOff.Refused)
	if pct(good) < 99 {
		t.Errorf("p2: %.1f %% accepted under the flood (%+v), want >= 99 %%", pct(good), good)
	}

	// The mailbox bound (issue 18): 60 KB sends to leaf2, which nobody pulls.
	db := s.hub.path("state/xmsg.db")
	before, _ := os.Stat(db)
	snd := s.send("svc:bot@leaf2", "N=400", "C=2", "SIZE=60000", "NORETRY=1")
	r := result[sendResult](t, snd)
	after, _ := os.Stat(db)
	t.Logf("400 sends of 60 KB to a leaf nobody pulls: %d accepted, %d refused (%s); hub.db %.1f MB → %.1f MB",
		r.Sent, r.Refused, strings.TrimSpace(r.Detail), float64(before.Size())/1e6, float64(after.Size())/1e6)
	// 16 MiB of stored rows hold fewer than 16 MiB / 60 KB of them.
	if r.Sent*60000 > 16<<20 || r.Refused == 0 || !strings.Contains(r.Detail, "mailbox of leaf 'leaf2' is full") {
		t.Errorf("mailbox bound: %+v", r)
	}
}
