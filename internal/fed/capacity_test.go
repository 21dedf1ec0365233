package fed

import (
	"fmt"
	"strings"
	"testing"
)

// TestCapacityLineTellsTheTruth: doctor's capacity line promises each peer room of its own
// only where the budget gives it (room), in every budget, none for 0 peers, and its shared
// count is what is left after that room.
func TestCapacityLineTellsTheTruth(t *testing.T) {
	for _, flag := range []int{0, MinConns, 64, 1000} {
		for _, nofile := range []uint64{0, 64, 1024, 65536} {
			c := sizeCapacity(flag, nofile)
			for _, inbound := range []int{0, 1, c.auth - 1, c.auth, c.auth + 1, 50, 1000} {
				if inbound < 0 {
					continue
				}
				line := c.describe(inbound)
				promised := strings.Contains(line, "room for 1 of its own for each of the "+fmt.Sprint(inbound)+" peers")
				if got := promised; got != (c.room(inbound) == 1) {
					t.Errorf("budget %d authenticated, %d peers (room %d): line promises room: %v\n%s", c.auth, inbound, c.room(inbound), got, line)
				}
				if !promised && strings.Contains(line, "room for 1 of its own") {
					t.Errorf("budget %d, %d peers: %s", c.auth, inbound, line)
				}
				if inbound > 0 && c.room(inbound) == 0 && !strings.Contains(line, fmt.Sprintf("no room of its own for any of the %d peers", inbound)) {
					t.Errorf("budget %d, %d peers: want it said that they keep none:\n%s", c.auth, inbound, line)
				}
				if want := fmt.Sprintf(", %d shared", c.auth-c.room(inbound)*inbound); !strings.Contains(line, want) {
					t.Errorf("budget %d, %d peers: want %q in\n%s", c.auth, inbound, want, line)
				}
			}
		}
	}
}
