package daemon

import (
	"log/slog"
	"net"

	"github.com/xmsg/xmsg/internal/activation"
	"github.com/xmsg/xmsg/internal/agentsock"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/httpapi"
	"github.com/xmsg/xmsg/internal/registersock"
)

// The fairness bounds of the three sockets (docs/design.md §3), from the flags to each
// server's Config, so that serve only passes them on.

func httpLimits(cfg *config.Config) httpapi.Limits {
	l := cfg.Limits
	return httpapi.Limits{MaxConns: l.HTTPMaxConns, MaxPerPID: l.HTTPMaxPerPID, MaxWaitersPerPID: l.HTTPMaxWaitersPerPID,
		HeaderTimeout: l.HTTPHeaderTimeout, BodyTimeout: l.HTTPBodyTimeout, IdleTimeout: l.HTTPIdleTimeout, NoEvict: l.NoEvict}
}

// httpListener caps http.sock's connections (gated is a gate.Listener).
func httpListener(gated net.Listener, cfg *config.Config, log *slog.Logger) net.Listener {
	return httpapi.Listener(gated, httpLimits(cfg), "http", log)
}

// tcpListener caps the optional TCP listener's connections. TCP peers carry no pid, so each
// connection is its own holder (one account for all let another uid's idle keep-alives and
// long-polls starve the owner's).
func tcpListener(l net.Listener, cfg *config.Config, log *slog.Logger) net.Listener {
	lim := httpLimits(cfg)
	lim.PerConnection = true
	return httpapi.Listener(l, lim, "tcp", log)
}

// agentLimits fills the fairness fields of an agent.sock config.
func agentLimits(c agentsock.Config, cfg *config.Config) agentsock.Config {
	c.MaxPending, c.MaxPerPID, c.PendingTimeout = cfg.Limits.AgentMaxPending, cfg.Limits.AgentMaxPerPID, cfg.Limits.AgentPendingTimeout
	c.NoEvict = cfg.Limits.NoEvict
	return c
}

// registerLimits fills the fairness fields of a register.sock config.
func registerLimits(c registersock.Config, cfg *config.Config) registersock.Config {
	l := cfg.Limits
	c.MaxConns, c.MaxPending, c.MaxPerPID, c.MaxUIDOnly = l.RegisterMaxConns, l.RegisterMaxPending, l.RegisterMaxPerPID, l.RegisterMaxUIDOnly
	c.FirstFrameTimeout, c.IdleTimeout = l.RegisterFirstFrameTimeout, l.RegisterIdleTimeout
	c.NoEvict = l.NoEvict
	return c
}

// ownSockets are the paths the daemon's Unix listeners are bound to (self-bound or passed by
// systemd), for the bus to refuse a session inbox that is one of them.
func ownSockets(socks *activation.Sockets, reports *claude.Reports) []string {
	var out []string
	if reports != nil {
		out = append(out, reports.Path())
	}
	for _, l := range []net.Listener{socks.HTTP, socks.Agent, socks.Register} {
		if l == nil {
			continue
		}
		if a, ok := l.Addr().(*net.UnixAddr); ok && a.Name != "" && a.Name[0] != '@' {
			out = append(out, a.Name)
		}
	}
	return out
}
