package servergroup

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// httpServer is a real HTTP server on a real Unix socket.
func httpServer(t *testing.T, name string) (Server, net.Listener) {
	t.Helper()
	l, err := net.Listen("unix", t.TempDir()+"/"+name+".sock")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
	return Server{Name: name, Serve: func() error { return srv.Serve(l) }, Shutdown: srv.Shutdown}, l
}

func TestStopOnCancelIsClean(t *testing.T) {
	started, stopping := make(chan bool, 1), make(chan bool, 1)
	g := Group{Drain: time.Second, Started: func() error { started <- true; return nil }, Stopping: func() { stopping <- true }}
	a, la := httpServer(t, "a")
	b, _ := httpServer(t, "b")
	g.Add(a)
	g.Add(b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	<-started
	// Positive control: the servers answer while the group runs.
	c, err := net.Dial("unix", la.Addr().String())
	if err != nil {
		t.Fatalf("server a does not accept: %v", err)
	}
	c.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	select {
	case <-stopping:
	default:
		t.Fatal("Stopping was not called")
	}
}

// A server that dies (here: its listener closed behind its back) stops the whole group with
// an error naming it, and the other servers are shut down.
func TestOneFailedServerStopsAll(t *testing.T) {
	var la net.Listener
	g := Group{Drain: time.Second, Started: func() error { la.Close(); return nil }}
	a, la := httpServer(t, "a")
	b, lb := httpServer(t, "b")
	g.Add(a)
	g.Add(b)
	done := make(chan error, 1)
	go func() { done <- g.Run(context.Background()) }()
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "server a stopped") {
		t.Fatalf("Run = %v, want an error naming server a", err)
	}
	if _, err := net.Dial("unix", lb.Addr().String()); err == nil {
		t.Fatal("server b still accepts after the group stopped")
	}
}

func TestServeReturningNilIsAFailure(t *testing.T) {
	g := Group{Drain: time.Second}
	g.Add(Server{Name: "quiet", Serve: func() error { return nil }, Shutdown: func(context.Context) error { return nil }})
	err := g.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "quiet stopped: returned without an error") {
		t.Fatalf("Run = %v, want a failure", err)
	}
}

func TestStartedErrorStopsTheGroup(t *testing.T) {
	boom := errors.New("notify: READY=1 refused")
	g := Group{Drain: time.Second, Started: func() error { return boom }}
	a, _ := httpServer(t, "a")
	g.Add(a)
	err := g.Run(context.Background())
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want %v", err, boom)
	}
}

// The drain is bounded: a server whose shutdown does not finish makes Run return the
// deadline error instead of hanging.
func TestDrainIsBounded(t *testing.T) {
	g := Group{Drain: 50 * time.Millisecond}
	release := make(chan struct{})
	g.Add(Server{Name: "stuck",
		Serve:    func() error { <-release; return nil },
		Shutdown: func(ctx context.Context) error { <-ctx.Done(); close(release); return ctx.Err() }})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := g.Run(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "drain stuck") {
		t.Fatalf("Run = %v, want the drain deadline for stuck", err)
	}
}
