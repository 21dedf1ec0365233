package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"syscall"
	"time"
)

// The test binary is also the daemon of the e2e tests (ostest.Command): these knobs exist only
// in it, never in the xmsg binary.
func init() {
	testAckDelay = func() time.Duration {
		d, _ := time.ParseDuration(os.Getenv("XMSG_TEST_ACK_DELAY"))
		return max(d, 0)
	}
	testRecordRide = func() time.Duration {
		d, _ := time.ParseDuration(os.Getenv("XMSG_TEST_RECORD_RIDE"))
		return d // < 0: none, a commit at once
	}
	testCPUProfile = func() func() {
		stopTrace, stopProfile := execTrace(), cpuProfile()
		if stopTrace == nil {
			return stopProfile
		}
		return func() {
			if stopProfile != nil {
				stopProfile()
			}
			stopTrace()
		}
	}
}

// execTrace records the daemon's execution trace where XMSG_TEST_TRACE=PREFIX says
// (PREFIX.PID), over the whole run: where a goroutine waited to run, not only where the CPU
// went (go tool trace -pprof=sched). Opened here, before the sandbox.
func execTrace() func() {
	prefix := os.Getenv("XMSG_TEST_TRACE")
	if prefix == "" {
		return nil
	}
	f, err := os.Create(fmt.Sprintf("%s.%d.trace", prefix, os.Getpid()))
	if err != nil {
		return nil
	}
	if trace.Start(f) != nil {
		f.Close()
		return nil
	}
	return func() {
		trace.Stop()
		f.Close()
	}
}

// cpuProfile profiles the daemon where XMSG_TEST_CPUPROFILE=PREFIX says: PREFIX.PID. With
// XMSG_TEST_CPUPROFILE_PARTS=N it writes N profiles, PREFIX.PID.0 to .N-1, and each SIGUSR1
// ends one and starts the next, so that a script watching the bench's progress can cut the
// daemon's profile at its paths. With XMSG_TEST_BLOCKPROFILE set it also records blocking and
// mutex contention and writes them, over the whole run, to PREFIX.PID.block and .mutex;
// XMSG_TEST_CPUPROFILE_HZ sets the sampling rate (default 100). Every
// file is opened here, before the daemon's sandbox forbids creating any.
func cpuProfile() func() {
	prefix := os.Getenv("XMSG_TEST_CPUPROFILE")
	if prefix == "" {
		return nil
	}
	base := fmt.Sprintf("%s.%d", prefix, os.Getpid())
	parts, _ := strconv.Atoi(os.Getenv("XMSG_TEST_CPUPROFILE_PARTS"))
	var files []*os.File
	if parts <= 1 {
		f, err := os.Create(base)
		if err != nil {
			return nil
		}
		files = append(files, f)
	}
	for i := range parts {
		f, err := os.Create(fmt.Sprintf("%s.%d", base, i))
		if err != nil {
			return nil
		}
		files = append(files, f)
	}
	var block, mutex *os.File
	if os.Getenv("XMSG_TEST_BLOCKPROFILE") != "" {
		var err error
		if block, err = os.Create(base + ".block"); err != nil {
			return nil
		}
		if mutex, err = os.Create(base + ".mutex"); err != nil {
			return nil
		}
		runtime.SetBlockProfileRate(10000) // one sample per 10 µs blocked
		runtime.SetMutexProfileFraction(10)
	}
	hz, _ := strconv.Atoi(os.Getenv("XMSG_TEST_CPUPROFILE_HZ"))
	start := func(f *os.File) error {
		if hz > 0 {
			// Before each StartCPUProfile, which then keeps this rate (saying on stderr that
			// it cannot set its own): at 1,000 Hz a send of a few hundred microseconds gets
			// ten times the samples of the default 100.
			runtime.SetCPUProfileRate(hz)
		}
		return pprof.StartCPUProfile(f)
	}
	if start(files[0]) != nil {
		return nil
	}
	next := make(chan os.Signal, 1)
	signal.Notify(next, syscall.SIGUSR1)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		cur := 0
		for {
			select {
			case <-next:
				if cur+1 < len(files) {
					pprof.StopCPUProfile()
					cur++
					start(files[cur])
				}
			case <-done:
				pprof.StopCPUProfile()
				return
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		signal.Stop(next)
		for _, f := range files {
			f.Close()
		}
		if block != nil {
			pprof.Lookup("block").WriteTo(block, 0)
			pprof.Lookup("mutex").WriteTo(mutex, 0)
			block.Close()
			mutex.Close()
		}
	}
}
