package httpapi

// Benchmarks of the durable send path, each read against the baselines measured in the same
// run: a raw Unix-socket round trip and one fsynced bbolt commit. Run:
//
//	go test -run '^$' -bench . -benchtime 3s ./internal/httpapi
import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

type benchEnv struct {
	sock   string
	b      *bus.Bus
	client *http.Client
	id     string
	inbox  chan string
}

// newBenchEnv serves the API on a real Unix socket, backed by a real store, with a Claude
// session whose pid is this process and whose inbox is a real socket in this process.
func newBenchEnv(tb testing.TB, onLine func(line string)) *benchEnv {
	dir, err := os.MkdirTemp("", "xb")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(filepath.Join(dir, "x.db"), time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	sessions := filepath.Join(dir, "s")
	os.Mkdir(sessions, 0o700)
	inboxPath := filepath.Join(dir, "inbox.sock")
	il, err := net.Listen("unix", inboxPath)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { il.Close() })
	go func() {
		for {
			c, err := il.Accept()
			if err != nil {
				return
			}
			go func() {
				line, _ := bufio.NewReader(c).ReadString('\n')
				c.Close()
				if onLine != nil {
					onLine(line)
				}
			}()
		}
	}()
	start, _ := peercred.Proc{}.StartTime(os.Getpid())
	id := "bench000-0000-0000-0000-000000000001"
	raw, _ := json.Marshal(map[string]any{"pid": os.Getpid(), "sessionId": id, "cwd": "/", "status": "idle", "kind": "interactive",
		"procStart": start, "messagingSocketPath": inboxPath})
	os.WriteFile(filepath.Join(sessions, id+".json"), raw, 0o600)
	b := bus.New(bus.Config{Host: "bench", MaxBody: 65536, ReplyTTL: time.Hour, IdemTTL: time.Hour, Store: st, Proc: peercred.Proc{}, Log: log,
		Claude: &claude.Scanner{Dirs: []string{sessions}, Proc: peercred.Proc{}, UID: os.Geteuid(), Log: log}})
	tb.Cleanup(b.Close)
	sock := filepath.Join(dir, "http.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	srv := NewServer(Config{Bus: b, MaxBody: 65536, Log: log, Socket: "http"})
	go srv.Serve(l)
	tb.Cleanup(func() { srv.Close() })
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	return &benchEnv{sock: sock, b: b, client: client, id: id}
}

func (e *benchEnv) send(tb testing.TB, text string) string {
	resp, err := e.client.Post("http://x/v1/sessions/"+e.id+"/messages", "application/json", strings.NewReader(`{"from":"bench","text":"`+text+`"}`))
	if err != nil {
		tb.Fatal(err)
	}
	// Read to EOF so the keep-alive connection is reused, as a real client would.
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var d answer.Delivery
	if resp.StatusCode != 202 || json.Unmarshal(raw, &d) != nil {
		tb.Fatalf("send: %d", resp.StatusCode)
	}
	return d.MessageID
}

// latencies records per-op durations and reports percentiles as custom metrics.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }

func (l *latencies) report(b *testing.B) {
	if len(l.d) == 0 {
		return
	}
	sort.Slice(l.d, func(i, j int) bool { return l.d[i] < l.d[j] })
	b.ReportMetric(float64(l.d[len(l.d)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds()), "p99-µs")
}

func BenchmarkBaselineUnixRoundTrip(b *testing.B) {
	dir, _ := os.MkdirTemp("", "xb")
	defer os.RemoveAll(dir)
	l, err := net.Listen("unix", filepath.Join(dir, "echo.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
	}()
	c, err := net.Dial("unix", filepath.Join(dir, "echo.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	var lat latencies
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		c.Write(buf)
		io.ReadFull(c, buf)
		lat.add(time.Since(t0))
	}
	lat.report(b)
}

func BenchmarkBaselineBboltCommit(b *testing.B) {
	dir, _ := os.MkdirTemp("", "xb")
	defer os.RemoveAll(dir)
	db, err := bolt.Open(filepath.Join(dir, "x.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err })
	var lat latencies
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("b")).Put([]byte(fmt.Sprint(i)), []byte(`{"x":1}`)) })
		lat.add(time.Since(t0))
	}
	lat.report(b)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
}

// BenchmarkSendAnonymous: POST /v1/sessions/{ref}/messages to a live session, one sender.
// Each 202 includes delivery to the inbox socket and one fsynced commit.
func BenchmarkSendAnonymous(b *testing.B) {
	e := newBenchEnv(b, nil)
	var lat latencies
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		e.send(b, "hello")
		lat.add(time.Since(t0))
	}
	lat.report(b)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sends/s")
}

// BenchmarkSendAnonymousRawClient: the same send from a minimal client (one persistent
// connection, hand-written HTTP/1.1, like matrix-xmsg's), so the figure is the daemon's cost
// without net/http's client-side goroutine hand-offs.
func BenchmarkSendAnonymousRawClient(b *testing.B) {
	e := newBenchEnv(b, nil)
	c, err := net.Dial("unix", e.sock)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	body := `{"from":"bench","text":"hello"}`
	req := []byte("POST /v1/sessions/" + e.id + "/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	r := bufio.NewReader(c)
	var lat latencies
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 202 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		lat.add(time.Since(t0))
	}
	lat.report(b)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sends/s")
}

// BenchmarkSendAnonymous64: the same with 64 concurrent senders, whose commits are shared.
func BenchmarkSendAnonymous64(b *testing.B) {
	e := newBenchEnv(b, nil)
	var lat latencies
	b.SetParallelism((64 + b.N*0) / max(1, runtimeProcs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t0 := time.Now()
			e.send(b, "hello")
			lat.add(time.Since(t0))
		}
	})
	lat.report(b)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sends/s")
}

var idRE = regexp.MustCompile(`message_id=([0-9a-f-]{36})`)

// BenchmarkSendReplyRoundTrip: send, the session replies as soon as the line reaches its
// inbox, and the sender's long-poll returns the reply.
func BenchmarkSendReplyRoundTrip(b *testing.B) {
	var e *benchEnv
	e = newBenchEnv(b, func(line string) {
		if m := idRE.FindStringSubmatch(line); m != nil {
			caller := bus.Caller{Harness: "claude", SessionID: e.id, Name: e.id}
			if _, err := e.b.Reply(context.Background(), caller, m[1], "pong"); err != nil {
				b.Error(err)
			}
		}
	})
	var lat latencies
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		id := e.send(b, "ping")
		resp, err := e.client.Get("http://x/v1/messages/" + id + "/replies?wait=10")
		if err != nil {
			b.Fatal(err)
		}
		var rs []answer.Reply
		json.NewDecoder(resp.Body).Decode(&rs)
		resp.Body.Close()
		if len(rs) != 1 || rs[0].Text != "pong" {
			b.Fatalf("replies = %+v", rs)
		}
		lat.add(time.Since(t0))
	}
	lat.report(b)
}
