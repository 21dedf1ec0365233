package httpapi

// Breakdown benchmarks: where a send's time goes below the HTTP layer.

import (
	"context"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
)

func BenchmarkBreakdownBusSend(b *testing.B) {
	e := newBenchEnv(b, nil)
	var lat latencies
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := e.b.Send(context.Background(), bus.Send{To: envelope.ParseRef(e.id), Text: "hello", FromName: "x", Principal: "p"}); err != nil {
			b.Fatal(err)
		}
		lat.add(time.Since(t0))
	}
	lat.report(b)
}

func BenchmarkBreakdownResolve(b *testing.B) {
	e := newBenchEnv(b, nil)
	for i := 0; i < b.N; i++ {
		if _, err := e.b.Resolve(e.id); err != nil {
			b.Fatal(err)
		}
	}
}
