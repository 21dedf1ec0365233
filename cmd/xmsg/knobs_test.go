package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"time"
)

// The test binary is also the daemon of the e2e tests (ostest.Command): these knobs exist only
// in it, never in the xmsg binary.
func init() {
	testAckDelay = func() time.Duration {
		d, _ := time.ParseDuration(os.Getenv("XMSG_TEST_ACK_DELAY"))
		return max(d, 0)
	}
	testCPUProfile = func() func() {
		prefix := os.Getenv("XMSG_TEST_CPUPROFILE")
		if prefix == "" {
			return nil
		}
		f, err := os.Create(fmt.Sprintf("%s.%d", prefix, os.Getpid()))
		if err != nil {
			return nil
		}
		if pprof.StartCPUProfile(f) != nil {
			f.Close()
			return nil
		}
		return func() { pprof.StopCPUProfile(); f.Close() }
	}
}
