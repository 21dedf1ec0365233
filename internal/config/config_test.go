package config

import (
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/limits"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestPrecedenceFlagEnvDefault(t *testing.T) {
	e := env(map[string]string{"HOME": "/home/u", "XMSG_MAX_BODY": "100", "XMSG_REPLY_TTL": "60", "XMSG_HOST_LABEL": "envhost",
		"XMSG_SESSIONS_DIR": "/a:/b", "XMSG_SVC_EXE": "matrix=/bin/m,svc:genie=/bin/g,noequals", "STATE_DIRECTORY": "/var/lib/xmsg-public"})
	c, err := Parse([]string{"--max-body", "200", "--agent-idle-timeout", "5s"}, e)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBody != 200 || c.ReplyTTL != time.Minute || c.HostLabel != "envhost" || c.AgentIdleTimeout != 5*time.Second || c.AgentMaxConns != 32 {
		t.Errorf("got %+v", c)
	}
	if strings.Join(c.SessionsDirs, ",") != "/a,/b" {
		t.Errorf("sessions dirs = %v", c.SessionsDirs)
	}
	if c.SvcExe["matrix"] != "/bin/m" || c.SvcExe["genie"] != "/bin/g" || len(c.SvcExe) != 2 {
		t.Errorf("svc exe = %v", c.SvcExe)
	}
	if c.DBPath != "/var/lib/xmsg-public/xmsg.db" {
		t.Errorf("db path = %s", c.DBPath)
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse(nil, env(map[string]string{"HOME": "/home/u"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.DBPath != "/home/u/.local/state/xmsg/xmsg.db" || c.SessionsDirs[0] != "/home/u/.claude/sessions" || c.Listen != "" ||
		c.MaxBody != 65536 || c.IdempotencyTTL != 24*time.Hour || c.AgentMaxLine != 1<<20 || c.RequireLandlock {
		t.Errorf("defaults = %+v", c)
	}
}

func TestRefusals(t *testing.T) {
	for _, args := range [][]string{
		{"--max-body", "0"}, {"--max-body", "x"}, {"--reply-ttl", "-1"}, {"--agent-idle-timeout", "soon"},
		{"--svc-exe", "name=relative/path"}, {"--listen", "nope"},
		{"--fed-listen", "0.0.0.0:7788"}, {"--fed-listen", "[::]:7788"}, {"--fed-listen", "host.example:7788"}, {"--fed-listen", "10.0.0.1"},
		{"--fed-listen", "10.0.0.1:0"}, {"--fed-reload-interval-secs", "-1"}, {"--fed-rate-peer", "0"},
		{"--sessions-dir", "relative"}, {"--log-level", "loud"}, {"--bogus"}, {"stray"},
	} {
		if _, err := Parse(args, env(map[string]string{"HOME": "/h"})); err == nil {
			t.Errorf("Parse(%v) accepted", args)
		}
	}
}

func TestFederationFlags(t *testing.T) {
	c, err := Parse([]string{"--fed-listen", "192.0.2.1:7443"}, env(map[string]string{"HOME": "/h", "XMSG_FED_RELOAD_INTERVAL_SECS": "0", "XMSG_FED_RATE_PRINCIPAL": "5"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.FedListen != "192.0.2.1:7443" || c.FedReloadInterval != 0 || c.FedRatePrincipal != 5 || c.FedRatePeer != 60 {
		t.Errorf("got %+v", c)
	}
	c, _ = Parse(nil, env(map[string]string{"HOME": "/h"}))
	if c.FedReloadInterval != 30*time.Second {
		t.Errorf("default reload interval = %s, want 30s", c.FedReloadInterval)
	}
}

func TestRequireLandlockFromEnvAndFlag(t *testing.T) {
	c, _ := Parse(nil, env(map[string]string{"HOME": "/h", "XMSG_REQUIRE_LANDLOCK": "true"}))
	if !c.RequireLandlock {
		t.Error("env XMSG_REQUIRE_LANDLOCK=true ignored")
	}
	c, _ = Parse([]string{"--require-landlock"}, env(map[string]string{"HOME": "/h"}))
	if !c.RequireLandlock {
		t.Error("--require-landlock ignored")
	}
}

// TestHelpShowsTheDefaultsParseUses: --help prints, for every flag, the very default that
// Parse applies (one table holds both), and the numeric defaults are package limits' values.
func TestHelpShowsTheDefaultsParseUses(t *testing.T) {
	var help strings.Builder
	Usage(&help)
	for _, o := range options {
		want := o.def
		if want == "" {
			want = o.doc
		}
		if want == "" {
			t.Errorf("--%s has neither a default nor a description of one", o.name)
		}
		if !strings.Contains(help.String(), "env "+o.env+", default "+want+"\n") {
			t.Errorf("--help lacks %q for --%s", "default "+want, o.name)
		}
	}
	c, err := Parse(nil, env(map[string]string{"HOME": "/h"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBody != limits.MaxBody || c.AgentMaxLine != limits.AgentMaxLine || c.AgentMaxConns != limits.AgentMaxConns ||
		c.AgentIdleTimeout != limits.AgentIdleTimeout || c.AgentWriteTimeout != limits.AgentWriteTimeout ||
		c.ReplyTTL != limits.ReplyTTL || c.IdempotencyTTL != limits.IdempotencyTTL || c.LogLevel != "info" {
		t.Errorf("Parse(nil) = %+v, want package limits' defaults", c)
	}
}
