package registersock_test

import (
	"bytes"
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/store"
)

// BenchmarkPollAck: one service consumer drains its queue over register.sock, a poll and an
// ack per message, in process (the queue is refilled with the timer stopped). cpu-µs/msg is
// the process's CPU, server and client side, per message: compare runs, not absolute values.
func BenchmarkPollAck(b *testing.B) {
	e := daemontest.New(b, daemontest.Options{SvcExe: map[string]string{"bot": os.Args[0]}})
	c := daemontest.Dial(b, e.RegPath)
	if got := c.Call(map[string]any{"harness": "svc", "name": "bot", "cwd": "/"}); got["status"] != "ok" {
		b.Fatal(got)
	}
	text := string(bytes.Repeat([]byte("x"), 200))
	fill := func(n int) {
		for range n {
			if _, err := e.Bus.Send(context.Background(), bus.Send{To: envelope.ParseRef("svc:bot"), Text: text, Bytes: len(text), FromName: "bench",
				Principal: "http:bench"}); err != nil {
				b.Fatal(err)
			}
		}
	}
	poll := []byte(`{"action":"poll","waitSecs":0}` + "\n")
	idKey := []byte(`"messageId":"`)
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; {
		b.StopTimer()
		n := min(b.N-i, store.MaxQueue)
		fill(n)
		time.Sleep(10 * time.Millisecond) // the acks' deletes are committed (ackRide)
		b.StartTimer()
		cpu0 := cpuNow()
		for range n {
			c.Write(poll)
			line, _ := c.Recv()
			j := bytes.Index([]byte(line), idKey)
			if j < 0 {
				b.Fatalf("poll: %s", line)
			}
			id := line[j+len(idKey) : j+len(idKey)+36]
			c.Write([]byte(`{"action":"ack","messageId":"` + id + `"}` + "\n"))
			if l, _ := c.Recv(); l != `{"status":"ok"}` {
				b.Fatalf("ack: %s", l)
			}
		}
		cpu += cpuNow() - cpu0
		i += n
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/msg")
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
