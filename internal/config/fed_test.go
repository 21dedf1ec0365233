package config

import (
	"strings"
	"testing"
	"time"
)

func TestFedListenerFlags(t *testing.T) {
	home := env(map[string]string{"HOME": "/h"})
	c, err := Parse(nil, home)
	if err != nil || c.FedMaxConns != 0 || c.FedBodyTimeout != 10*time.Second {
		t.Fatalf("defaults: %+v %v, want 0 (from RLIMIT_NOFILE) and 10s", c, err)
	}
	c, err = Parse([]string{"--fed-max-conns", "5000", "--fed-body-timeout", "3s"}, home)
	if err != nil || c.FedMaxConns != 5000 || c.FedBodyTimeout != 3*time.Second {
		t.Errorf("given: %+v %v", c, err)
	}
	for _, bad := range []string{"31", "-1", "x"} {
		if _, err := Parse([]string{"--fed-max-conns", bad}, home); err == nil || !strings.Contains(err.Error(), "--fed-max-conns") {
			t.Errorf("--fed-max-conns %s: %v, want refused", bad, err)
		}
	}
}
