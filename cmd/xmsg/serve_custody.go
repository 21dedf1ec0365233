package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/doctor"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/sandbox"
)

// custodian is the daemon's wiring of internal/custody: the secrets are read with the other
// credentials (step 1b, before the sandbox), their plain files' directories stay readable
// for reload (step 5), the holder is given to agent.sock and register.sock (step 6), and a
// reloader runs on an interval and on SIGHUP. Every method is a no-op without secrets, so
// serve calls them unconditionally.
type custodian struct {
	cfg    *config.Config
	log    *slog.Logger
	holder *custody.Holder // nil: no secrets configured
}

// loadCustody reads the custody secrets. When any is held the daemon makes itself
// non-dumpable: another process of the uid could otherwise open /proc/<daemon>/fd/<memfd>
// (a PTRACE_MODE_READ check, which Yama does not restrict) or read the daemon's memory.
func loadCustody(cfg *config.Config, log *slog.Logger, exe func(int) (string, error)) (*custodian, error) {
	c := &custodian{cfg: cfg, log: log}
	if len(cfg.Custody) == 0 {
		return c, nil
	}
	h, err := custody.Load(custody.Config{Secrets: cfg.Custody, SvcExe: cfg.SvcExe, Exe: exe, Log: log})
	if err != nil {
		return nil, err
	}
	c.holder = h
	if err := nonDumpable(); err != nil {
		h.Close()
		return nil, err
	}
	return c, nil
}

// loadCustody is step 1b.
func (d *instance) loadCustody() error {
	// The exehelper starts later (step 4b); the holder asks through whichever reads
	// executables when a hand-over happens. Without a helper this process reads /proc
	// itself, which Landlock denies for other processes: attestation then fails closed.
	exe := func(pid int) (string, error) {
		if d.exe != nil {
			return d.exe(pid)
		}
		return peercred.Proc{}.Exe(pid)
	}
	c, err := loadCustody(d.cfg, d.log, exe)
	if err != nil {
		return err
	}
	d.custody = c
	d.onClose(c.close)
	d.facts.PtraceScope = doctor.PtraceScope()
	return nil
}

func (c *custodian) close() error { return c.holder.Close() }

// restrict keeps the directories of plain-file secrets readable (a rotation that renames a
// new file into place needs the directory, not the old inode).
func (c *custodian) restrict(p *sandbox.Policy) {
	for _, path := range c.cfg.CustodyFiles() {
		p.ReadOnly = append(p.ReadOnly, filepath.Dir(path))
	}
}

// reload runs until ctx ends: every --custody-reload-interval-secs and on each SIGHUP the
// secrets are read again (a SIGHUP re-reads the federation credentials too). SIGHUP is
// caught even without secrets, so that it never ends the daemon.
func (c *custodian) reload(ctx context.Context, fed *federation) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	var tick <-chan time.Time
	if c.holder != nil && c.cfg.CustodyReloadInterval > 0 {
		t := time.NewTicker(c.cfg.CustodyReloadInterval)
		defer t.Stop()
		tick = t.C
	}
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			c.holder.Reload()
		case <-hup:
			c.log.Info("reload", "reason", "SIGHUP")
			c.holder.Reload()
			if fed != nil && fed.node != nil {
				fed.node.Reload()
			}
		}
	}
}

// doctorFor adds the custody lines (each secret's name, pin, who may have it, its
// hand-overs) to the doctor of the listener named socket, except on the TCP listener, which
// has no peer check: who holds what for whom is for the uid's own processes only.
func (c *custodian) doctorFor(socket string, lines func() []string) func() []string {
	if c.holder == nil || socket == "tcp" {
		return lines
	}
	return func() []string { return append(lines(), c.holder.Lines()...) }
}
