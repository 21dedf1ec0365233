//go:build linux

package main

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"github.com/xmsg/xmsg/internal/ledger"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/fed/fedtest"
	"github.com/xmsg/xmsg/internal/ostest"
	"github.com/xmsg/xmsg/internal/store"
)

func init() {
	fedRoles["tlsecho"] = func() int { tlsEcho(); return 0 }
	fedRoles["tlsping"] = func() int { tlsPing(); return 0 }
}

func tlsPair() tls.Certificate {
	pair, err := tls.LoadX509KeyPair(os.Getenv("CERT"), os.Getenv("KEY"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return pair
}

// tlsEcho is a TLS 1.3 echo server on $ADDR (mutual TLS like the federation listener): the
// raw round trip the federation figures are compared with.
func tlsEcho() {
	l, err := tls.Listen("tcp", os.Getenv("ADDR"), &tls.Config{Certificates: []tls.Certificate{tlsPair()}, MinVersion: tls.VersionTLS13, ClientAuth: tls.RequireAnyClientCert})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("ready")
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go io.Copy(c, c)
	}
}

// tlsPing makes one TLS connection to $ADDR and times $N round trips of 256 bytes on it
// (no handshake in the timing). It prints the median and mean in nanoseconds.
func tlsPing() {
	c, err := tls.Dial("tcp", os.Getenv("ADDR"), &tls.Config{Certificates: []tls.Certificate{tlsPair()}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	n, _ := strconv.Atoi(os.Getenv("N"))
	buf := make([]byte, 256)
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for range n {
		t0 := time.Now()
		c.Write(buf)
		if _, err := io.ReadFull(c, buf); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		lat = append(lat, time.Since(t0))
	}
	total := time.Since(start)
	fmt.Printf("%d %d\n", median(lat).Nanoseconds(), total.Nanoseconds()/int64(max(n, 1)))
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkFederation measures, in one run, between two daemons in two network namespaces:
//
//   - bbolt_commit: one local store commit (fsynced), the unit of durability;
//   - tls_rtt: one round trip on a kept-alive mutual-TLS connection between the namespaces;
//   - send: a durable cross-node send (HTTP on a's http.sock → mTLS → b commits and delivers
//     to a Claude session → a commits → 202), target ≤ 1.25 × (2 commits + 1 TLS round trip);
//   - send_reply: the send, then a long-poll on a for the reply that a service on b writes.
//
// The daemons run as the benchmark's own user (root), so the loop can use their sockets
// directly. Each reports its median as p50-ns; "handshakes" counts the outbound TLS
// handshakes a made during the timed loop (0: none on the hot path).
func BenchmarkFederation(b *testing.B) {
	np := newNetPair(b)
	exe, err := filepath.EvalSymlinks(os.Args[0])
	if err != nil {
		b.Fatal(err)
	}
	root := ostest.User{Name: "root"}
	na := newFedNode(b, "a", np.a, "192.0.2.1", exe, root)
	nb := newFedNode(b, "b", np.b, "192.0.2.2", exe, root)
	na.writeFile("peers.json", peersJSON(map[string]map[string]any{"b": {"address": nb.addr(), "pin": nb.cert.Pin, "allow": []string{"send", "reply", "list"}}}))
	nb.writeFile("peers.json", peersJSON(map[string]map[string]any{"a": {"address": na.addr(), "pin": na.cert.Pin, "allow": []string{"send", "reply", "list"}}}))
	lim := []string{"--fed-rate-peer", "100000000", "--fed-rate-principal", "100000000", "--fed-reload-interval-secs", "0"}
	// XMSG_BENCH_SENDER_DB puts the sender's store elsewhere (e.g. on tmpfs): both nodes
	// share this machine's disk, and their fsyncs contend there as they would not on two hosts.
	if p := os.Getenv("XMSG_BENCH_SENDER_DB"); p != "" {
		na.start(append(lim, "--db-path", filepath.Join(p, "a.db"))...)
	} else {
		na.start(lim...)
	}
	nb.start(lim...)
	claudeID := startBenchClaude(b, nb.path("sessions"))
	localID := startBenchClaude(b, na.path("sessions"))
	client := unixClient(na.path("rt/xmsg/http.sock"))
	post := func(ref string) string {
		r := doHTTP(client, "POST", "http://localhost/v1/sessions/"+ref+"/messages", `{"from":"bench","text":"ping"}`)
		var m map[string]any
		json.Unmarshal(r.Body, &m)
		if r.Status != 202 {
			b.Fatalf("send: %d %s %s", r.Status, r.Body, r.Err)
		}
		return str(m["messageId"])
	}
	handshakes := func() int {
		r := doHTTP(client, "GET", "http://localhost/v1/doctor", "")
		m := regexp.MustCompile(`federation outbound handshakes: (\d+)`).FindSubmatch(r.Body)
		if m == nil {
			b.Fatalf("doctor: %s", r.Body)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	post(claudeID + "@b") // warm the pooled connection

	b.Run("bbolt_commit", func(b *testing.B) {
		st, err := store.Open(filepath.Join(b.TempDir(), "x.db"), time.Second)
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		lat := make([]time.Duration, 0, b.N)
		for i := 0; b.Loop(); i++ {
			t0 := time.Now()
			if err := st.Update(func(tx *store.Tx) error {
				return tx.PutMessage(store.Message{ID: fmt.Sprintf("m%09d", i), CreatedAt: time.Now().Unix(), Outcome: ledger.Delivered})
			}); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		b.ReportMetric(float64(median(lat).Nanoseconds()), "p50-ns")
	})
	b.Run("tls_rtt", func(b *testing.B) {
		dir := b.TempDir()
		c := fedtest.New(b, "echo", nil, fedtest.Options{})
		os.WriteFile(filepath.Join(dir, "c.pem"), c.CertPEM, 0o600)
		os.WriteFile(filepath.Join(dir, "k.pem"), c.KeyPEM, 0o600)
		env := append(os.Environ(), "CERT="+filepath.Join(dir, "c.pem"), "KEY="+filepath.Join(dir, "k.pem"), "ADDR=192.0.2.2:7444")
		echo := exec.Command("ip", "netns", "exec", np.b, exe)
		echo.Env = append(env, "XMSG_TEST_ROLE=tlsecho")
		out, _ := echo.StdoutPipe()
		if err := echo.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { echo.Process.Kill(); echo.Wait() }()
		bufio.NewReader(out).ReadString('\n')
		n := max(b.N, 1000)
		ping := exec.Command("ip", "netns", "exec", np.a, exe)
		ping.Env = append(env, "XMSG_TEST_ROLE=tlsping", "N="+strconv.Itoa(n))
		ping.Stderr = os.Stderr
		res, err := ping.Output()
		if err != nil {
			b.Fatal(err)
		}
		var p50, mean float64
		fmt.Sscan(string(res), &p50, &mean)
		b.ReportMetric(mean, "ns/op")
		b.ReportMetric(p50, "p50-ns")
	})
	b.Run("local_send", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			post(localID)
			lat = append(lat, time.Since(t0))
		}
		b.ReportMetric(float64(median(lat).Nanoseconds()), "p50-ns")
	})
	b.Run("send", func(b *testing.B) {
		h0 := handshakes()
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			post(claudeID + "@b")
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		b.ReportMetric(float64(median(lat).Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(handshakes()-h0), "handshakes")
	})
	b.Run("send_reply", func(b *testing.B) {
		stop := startResponder(b, nb)
		defer stop()
		h0 := handshakes()
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			id := post("svc:bot@b")
			r := doHTTP(client, "GET", "http://localhost/v1/messages/"+id+"/replies?wait=10", "")
			if r.Status != 200 || !strings.Contains(string(r.Body), "pong") {
				b.Fatalf("replies: %d %s %s", r.Status, r.Body, r.Err)
			}
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		b.ReportMetric(float64(median(lat).Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(handshakes()-h0), "handshakes")
	})
}

// startBenchClaude starts a fake Claude session (a real process with an inbox socket) whose
// session file is in dir; it returns the session id.
func startBenchClaude(b *testing.B, dir string) string {
	sockDir, err := os.MkdirTemp("", "inbox")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(sockDir) })
	id := "b0000000-0000-4000-8000-000000000001"
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "XMSG_TEST_ROLE=fedclaude", "SESSION_DIR="+dir, "SESSION_ID="+id, "SESSION_NAME=bench",
		"SESSION_CWD=/", "SESSION_FILE="+id+".json", "INBOX_SOCK="+filepath.Join(sockDir, "inbox.sock"), "INBOX_LOG=/dev/null")
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); cmd.Wait() })
	bufio.NewReader(out).ReadString('\n')
	return id
}

// startResponder registers this process as svc:bot on n (its executable is the trusted
// one) and answers every message with "pong" on register.sock.
func startResponder(b *testing.B, n *fedNode) (stop func()) {
	c, err := net.Dial("unix", n.path("rt/xmsg/register.sock"))
	if err != nil {
		b.Fatal(err)
	}
	r := bufio.NewReader(c)
	call := func(v any) map[string]any {
		raw, _ := json.Marshal(v)
		c.Write(append(raw, '\n'))
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil
		}
		var m map[string]any
		json.Unmarshal(line, &m)
		return m
	}
	if got := call(map[string]any{"harness": "svc", "name": "bot"}); got["status"] != "ok" {
		b.Fatalf("register: %v", got)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			d := call(map[string]any{"action": "poll", "waitSecs": 30})
			if d == nil {
				return
			}
			if d["action"] != "deliver" {
				continue
			}
			id := str(d["messageId"])
			call(map[string]any{"action": "reply", "messageId": id, "text": "pong"})
			call(map[string]any{"action": "ack", "messageId": id})
		}
	}()
	return func() { c.Close(); <-done }
}
