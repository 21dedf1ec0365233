package main

import (
	"os"
	"time"
)

// The test binary is also the daemon of the e2e tests (ostest.Command): these knobs exist only
// in it, never in the xmsg binary.
func init() {
	testAckDelay = func() time.Duration {
		d, _ := time.ParseDuration(os.Getenv("XMSG_TEST_ACK_DELAY"))
		return max(d, 0)
	}
}
