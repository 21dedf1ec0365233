// Package servergroup runs the daemon's servers (one per socket) as one unit: they start
// together, the first one that fails stops them all, and a stop drains every one of them
// within one deadline.
//
// Why a group and not a goroutine per server that logs its error: a daemon whose http.sock
// server died but whose other sockets still answer has already sent READY=1, so systemd
// believes it healthy and Restart=on-failure never fires. A failed server must end the
// process with a non-zero exit, and the group is what turns "one server returned" into
// "the daemon stops".
//
// Outcomes of [Group.Run]:
//
//   - ctx is cancelled (SIGTERM): every server is shut down (in the order they were added,
//     bounded by the drain deadline) and Run returns nil, or the drain error when a server
//     did not finish in time.
//   - a server's serve function returns before any stop began, whatever it returns (even
//     nil or net.ErrClosed: a listener closed behind the daemon's back is a failure too):
//     the others are shut down the same way and Run returns an error naming that server.
package servergroup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Server is one served socket: serve blocks until the server stops; shutdown stops it and
// waits (bounded by its context) for its connections to finish.
type Server struct {
	Name     string
	Serve    func() error
	Shutdown func(context.Context) error
}

// Group is a set of servers run together.
type Group struct {
	// Drain bounds the shutdown of all servers together.
	Drain time.Duration
	// Started, if set, runs once every serve goroutine has been launched. The listeners
	// were bound (or inherited) before Run, so every socket already accepts: connections
	// wait in the kernel's backlog. An error (for example a failed READY=1) stops the group
	// like a server failure does.
	Started func() error
	// Stopping, if set, runs once when the stop begins, before the drain (STOPPING=1).
	Stopping func()

	servers []Server
}

// Add registers a server; it starts when Run is called.
func (g *Group) Add(s Server) { g.servers = append(g.servers, s) }

// Len is the number of servers added.
func (g *Group) Len() int { return len(g.servers) }

// exit is what one server's serve function returned.
type exit struct {
	name string
	err  error
}

// Run starts every server and blocks until ctx is done or a server stops on its own (see
// the package doc for the outcomes).
func (g *Group) Run(ctx context.Context) error {
	exits := make(chan exit, len(g.servers))
	var wg sync.WaitGroup
	for _, s := range g.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			exits <- exit{s.Name, s.Serve()}
		}()
	}
	var failure error
	if g.Started != nil {
		if err := g.Started(); err != nil {
			failure = err
		}
	}
	if failure == nil {
		select {
		case <-ctx.Done():
		case e := <-exits:
			failure = fmt.Errorf("servergroup: server %s stopped: %v", e.name, orUnexpected(e.err))
		}
	}
	if g.Stopping != nil {
		g.Stopping()
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), g.Drain)
	defer cancel()
	var errs []error
	for _, s := range g.servers {
		if err := s.Shutdown(drainCtx); err != nil {
			errs = append(errs, fmt.Errorf("servergroup: drain %s: %w", s.Name, err))
		}
	}
	wg.Wait()
	return errors.Join(append([]error{failure}, errs...)...)
}

func orUnexpected(err error) error {
	if err == nil {
		return errors.New("returned without an error")
	}
	return err
}
