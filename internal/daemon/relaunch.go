package daemon

import (
	"context"
	"errors"
	"net"
	"os"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/relaunch"
)

// The relaunch (internal/relaunch, docs/operations.md §5): a session directory that appears or
// is replaced after the start cannot enter this process's Landlock domain, so the daemon
// watches for it and, when it comes, stops and starts again outside the domain: under systemd
// by exiting for a restart (the socket units keep the sockets), otherwise through the
// handover helper: started here, before the sandbox, by the first daemon; a daemon the helper
// started asks the same helper again (relaunch.Inherited, taken in New).

// watchSessionDirs is step 4d: the watch (before the sandbox, whose rules it would otherwise
// need) and, when this process owns its sockets, the handover helper that holds copies of them.
// The session directories the daemon may create are created first (prepareSessionDirs), so that
// creating them is no change to relaunch for.
func (d *Daemon) watchSessionDirs() error {
	d.prepareSessionDirs()
	if len(d.cfg.SessionsDirs) == 0 {
		return nil
	}
	w, skipped, err := relaunch.NewWatch(d.cfg.SessionsDirs)
	if err != nil {
		d.log.Warn("session dirs not watched; one that appears later is served only after a restart", "err", err)
		return nil
	}
	for dir, err := range skipped {
		d.log.Warn("session dir not watched; if it appears later it is served only after a restart", "dir", dir, "err", err)
	}
	d.watch = w
	d.onClose(w.Close)
	if d.handover != nil {
		// Started by the helper, which holds the sockets and starts the next daemon; the
		// pipe to it closes with this process, or at Close.
		d.onClose(func() error {
			if d.relaunchDir != "" {
				return nil
			}
			return d.handover.Close()
		})
		return nil
	}
	if d.socks.Activated || d.c.Args == nil {
		return nil // systemd's socket units hold the sockets across a restart
	}
	files, names, err := socketFiles(d.socks)
	if err != nil {
		d.log.Warn("no relaunch helper; a session dir that appears later is served only after a restart", "err", err)
		return nil
	}
	self, err := os.Executable()
	if err == nil {
		d.handover, err = relaunch.Prepare(self, d.c.Args, files, names)
	}
	for _, f := range files {
		f.Close() // the helper has its own copies
	}
	if err != nil {
		d.log.Warn("no relaunch helper; a session dir that appears later is served only after a restart", "err", err)
		return nil
	}
	// The helper ends with the daemon, unless it is the daemon's way to start again (Relaunch,
	// after Close).
	d.onClose(func() error {
		if d.relaunchDir != "" {
			return nil
		}
		return d.handover.Close()
	})
	return nil
}

// socketFiles duplicates the listening Unix sockets for the helper, with their names.
func socketFiles(s *activation.Sockets) (files []*os.File, names []string, err error) {
	for _, l := range []struct {
		name string
		l    net.Listener
	}{{activation.NameHTTP, s.HTTP}, {activation.NameAgent, s.Agent}, {activation.NameRegister, s.Register}} {
		ul, ok := l.l.(*net.UnixListener)
		if !ok {
			continue
		}
		f, ferr := ul.File()
		if ferr != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, nil, ferr
		}
		files, names = append(files, f), append(names, l.name)
	}
	if len(files) == 0 {
		return nil, nil, errors.New("no socket to hand over")
	}
	return files, names, nil
}

// watchRelaunch ends the run (stop) when a watched session directory changes, recording it
// for Relaunch; and in the first daemon when its relaunch helper has exited before any
// relaunch: a stop sent to the helper stops the daemon too.
func (d *Daemon) watchRelaunch(ctx context.Context, stop context.CancelFunc) {
	var changed <-chan string
	if d.watch != nil {
		changed = d.watch.C()
	}
	select {
	case <-ctx.Done():
	case <-d.handover.Done():
		d.log.Info("the relaunch helper ended; stopping")
		stop()
	case dir := <-changed:
		if d.handover != nil {
			// The socket files stay: the helper's copies of the sockets listen on them.
			for _, l := range []net.Listener{d.socks.HTTP, d.socks.Agent, d.socks.Register} {
				if ul, ok := l.(*net.UnixListener); ok {
					ul.SetUnlinkOnClose(false)
				}
			}
		}
		d.relaunchDir = dir
		d.log.Info("session dir appeared or was replaced; starting again so that the sandbox includes it", "dir", dir)
		stop()
	}
}

// Relaunch finishes a run that a session directory ended (call it after Close, when the store
// and the sockets are closed): it hands the sockets to the helper and, in the first daemon,
// waits for the helper in its place; a daemon the helper started, or one under systemd,
// returns at once. relaunched is false when the run ended for any other reason; code is the
// exit status to end with.
func (d *Daemon) Relaunch() (relaunched bool, code int) {
	if d.relaunchDir == "" {
		return false, 0
	}
	if d.handover == nil {
		return true, relaunch.ExitRestart
	}
	if err := d.handover.Go(d.relaunchDir); err != nil {
		d.log.Error("relaunch failed", "err", err)
		return true, 1
	}
	return true, d.handover.Wait()
}
