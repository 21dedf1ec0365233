package daemon

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/doctor"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/sandbox"
)

// Credential custody (internal/custody, docs/security.md §11): the secrets are read with the
// other credentials (step 1b, before the sandbox), their plain files' directories stay readable
// for reload (step 5), the holder is given to agent.sock and register.sock (step 6), and a
// reloader runs on an interval and on SIGHUP. Without secrets every part is a no-op.

// loadCustody is step 1b. When any secret is held the daemon makes itself non-dumpable:
// another process of the uid could otherwise open /proc/<daemon>/fd/<memfd> (a
// PTRACE_MODE_READ check, which Yama does not restrict) or read the daemon's memory.
func (d *Daemon) loadCustody() error {
	d.facts.PtraceScope = doctor.PtraceScope()
	if len(d.cfg.Custody) == 0 {
		return nil
	}
	// The exe helper starts later (step 4b); the holder asks through whichever reads
	// executables when a hand-over happens. Without a helper this process reads /proc
	// itself, which Landlock denies for other processes: attestation then fails closed.
	exe := func(pid int) (string, error) {
		if d.exe != nil {
			return d.exe(pid)
		}
		return peercred.Proc{}.Exe(pid)
	}
	h, err := custody.Load(custody.Config{Secrets: d.cfg.Custody, SvcExe: d.cfg.SvcExe, Exe: exe, Log: d.log})
	if err != nil {
		return err
	}
	if !d.c.InProcess {
		if err := nonDumpable(); err != nil {
			h.Close()
			return err
		}
	}
	d.custody = h
	d.onClose(h.Close)
	return nil
}

// restrictCustody keeps the directories of plain-file secrets readable (a rotation that
// renames a new file into place needs the directory, not the old inode).
func (d *Daemon) restrictCustody(p *sandbox.Policy) {
	for _, path := range d.cfg.CustodyFiles() {
		p.ReadOnly = append(p.ReadOnly, filepath.Dir(path))
	}
}

// reloadCustody runs until ctx ends: every --custody-reload-interval-secs and on each SIGHUP
// the secrets are read again (a SIGHUP re-reads the federation credentials too). SIGHUP is
// caught even without secrets, so that it never ends the daemon.
func (d *Daemon) reloadCustody(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var tick <-chan time.Time
	if d.custody != nil && d.cfg.CustodyReloadInterval > 0 {
		t := time.NewTicker(d.cfg.CustodyReloadInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			d.custody.Reload()
		case <-hup:
			d.log.Info("reload", "reason", "SIGHUP")
			d.custody.Reload()
			if d.fed != nil && d.fed.node != nil {
				d.fed.node.Reload()
			}
		}
	}
}

// custodyDoctor adds the custody lines (each secret's name, pin, who may have it, its
// hand-overs) to the doctor of the listener named socket, except on the TCP listener, which
// has no peer check: who holds what for whom is for the uid's own processes only.
func (d *Daemon) custodyDoctor(socket string, lines func() []string) func() []string {
	if d.custody == nil || socket == "tcp" {
		return lines
	}
	return func() []string { return append(lines(), d.custody.Lines()...) }
}
