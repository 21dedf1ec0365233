package agentsock_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/envelope"
)

// The two baselines put the socket benchmarks in proportion: every xmsg exchange is at least
// one Unix socket round trip, and every accepted send, reply or ack is at least one fsynced
// bbolt commit.

// BenchmarkBaselineUnixRoundTrip: one line out and one line back over a Unix stream socket.
func BenchmarkBaselineUnixRoundTrip(b *testing.B) {
	l, err := net.Listen("unix", filepath.Join(b.TempDir(), "echo.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			c.Write(line)
		}
	}()
	c, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	line := []byte(`{"action":"poll","waitSecs":0}` + "\n")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Write(line)
		if _, err := r.ReadBytes('\n'); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBaselineBboltCommit: one read-write transaction with one small put, fsynced.
func BenchmarkBaselineBboltCommit(b *testing.B) {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "b.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	val := make([]byte, 200)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		err := db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte("q"))
			if err != nil {
				return err
			}
			return bk.Put(binary.BigEndian.AppendUint64(nil, uint64(i)), val)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// benchService registers the benchmark process itself as svc:bench (the test binary is its
// trusted executable) and returns its register.sock connection.
func benchService(b *testing.B) (*daemontest.Env, *daemontest.Client) {
	e := daemontest.New(b, daemontest.Options{SvcExe: map[string]string{"bench": os.Args[0]}})
	reg := daemontest.Dial(b, e.RegPath)
	if got := reg.Call(map[string]any{"harness": "svc", "name": "bench"}); got["status"] != "ok" {
		b.Fatalf("register: %v", got)
	}
	return e, reg
}

// BenchmarkServicePollDeliverAck: a registered service drains its queue: poll → deliver → ack
// per message (one round trip and one commit each for deliver and ack).
func BenchmarkServicePollDeliverAck(b *testing.B) {
	e, reg := benchService(b)
	poll := []byte(`{"action":"poll","waitSecs":0}` + "\n")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%100 == 0 { // the queue holds at most 100 per session
			b.StopTimer()
			for j := 0; j < min(100, b.N-i); j++ {
				_, err := e.Bus.Send(context.Background(), bus.Send{To: envelope.ParseRef("svc:bench"), Text: "benchmark message", Bytes: 17,
					FromName: "xmsg@testhost · bench", Principal: "http:bench"})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
		reg.Write(poll)
		line, _ := reg.Recv()
		id := daemontest.DeliveredID(b, line)
		reg.Write([]byte(`{"action":"ack","messageId":"` + id + `"}` + "\n"))
		if ok, _ := reg.Recv(); ok != `{"status":"ok"}` {
			b.Fatalf("ack: %s", ok)
		}
	}
}

// BenchmarkAgentSendToServiceDeliver: an attested agent.sock send to a service that is
// long-polling, until the service holds the deliver frame (then it acks, untimed in the
// send-to-deliver metric but part of ns/op).
func BenchmarkAgentSendToServiceDeliver(b *testing.B) {
	e, reg := benchService(b)
	agent := daemontest.Dial(b, e.AgentPath)
	send := []byte(`{"action":"send","ref":"svc:bench","text":"benchmark message","push_replies":false}` + "\n")
	var latency time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		reg.Write([]byte(`{"action":"poll","waitSecs":30}` + "\n"))
		start := time.Now()
		agent.Write(send)
		if line, _ := agent.Recv(); len(line) < 20 || line[:15] != `{"status":"ok",` {
			b.Fatalf("send: %s", line)
		}
		line, _ := reg.Recv()
		latency += time.Since(start)
		id := daemontest.DeliveredID(b, line)
		reg.Write([]byte(`{"action":"ack","messageId":"` + id + `"}` + "\n"))
		reg.Recv()
	}
	b.ReportMetric(float64(latency.Nanoseconds())/float64(b.N), "send-to-deliver-ns/op")
}
