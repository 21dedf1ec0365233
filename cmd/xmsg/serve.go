package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/relaunch"
	"github.com/xmsg/xmsg/internal/store"
	// Aliased: the e2e tests of this package call their running daemon "daemon".
	xdaemon "github.com/xmsg/xmsg/internal/daemon"
)

func newLogger(level string, w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lvl}
	// journald stamps every line itself; a second timestamp is noise.
	if os.Getenv("JOURNAL_STREAM") != "" {
		opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the daemon (internal/daemon, the one assembly; this is its one caller in the
// binary): the flags in, then its startup steps, its servers until SIGTERM, and its close.
func serve(args []string, stdout io.Writer) error {
	// Signals are caught from the first line: a SIGTERM that arrives during startup ends it
	// between two steps, with everything opened so far closed again, instead of killing the
	// process half-started (and, once the notify socket is open, it says STOPPING=1).
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Under `go run` the daemon stops with the go command, which passes no signal on.
	relaunch.FollowGoRun(peercred.Proc{}.Exe)

	cfg, err := config.Parse(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		config.Usage(stdout)
		return nil
	}
	if err != nil {
		return usageError{err.Error()}
	}
	if stop := testCPUProfile(); stop != nil {
		defer stop()
	}
	d := xdaemon.New(xdaemon.Config{Config: cfg, Log: newLogger(cfg.LogLevel, os.Stderr), AckDelay: testAckDelay(), RecordRide: testRecordRide(), Args: args})
	defer d.Close()
	started, err := d.Start(ctx)
	if !started {
		var ce xdaemon.ConfigError
		if errors.As(err, &ce) {
			return usageError{err.Error()}
		}
		var re *store.RefusedError
		if errors.As(err, &re) {
			return exitError{exitStoreRefused, err}
		}
		return err
	}
	if err := d.Run(ctx); err != nil {
		return err
	}
	// A session dir that appeared ended the run: with the store and sockets closed, start
	// again outside this sandbox (internal/relaunch) and end as the new daemon ends.
	d.Close()
	if relaunched, code := d.Relaunch(); relaunched && code != 0 {
		return silentExit(code)
	}
	return nil
}

// testAckDelay holds acks uncommitted this long; always 0 in the xmsg binary. The e2e tests
// run their test binary as the daemon, and there (knobs_test.go) it reads XMSG_TEST_ACK_DELAY,
// so that a test can kill the daemon in the window a real crash after an ack would hit. A
// knob only a test binary has cannot be set on a real daemon by a stray environment variable.
var testAckDelay = func() time.Duration { return 0 }

// testRecordRide, when not 0, is how long a leaf's pulled rows' records ride (instead of
// leaf.RecordRide); always 0 in the xmsg binary, XMSG_TEST_RECORD_RIDE in the test binary.
var testRecordRide = func() time.Duration { return 0 }

// testCPUProfile starts a CPU profile of the daemon and returns what stops it (nil: none);
// always nil in the xmsg binary. In the test binary (knobs_test.go) XMSG_TEST_CPUPROFILE=PREFIX
// writes PREFIX.PID, so that a bench run as that binary profiles its hub and each leaf: the
// file is opened before the daemon's sandbox is applied.
var testCPUProfile = func() func() { return nil }
