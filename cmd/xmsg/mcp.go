package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/xmsg/xmsg/internal/mcp"
)

// mcpAbout names the bridge's tools from its own table, so that its help cannot drift from
// tools/list.
var mcpAbout = "Run by an agent session as its MCP server (docs/protocol.md §2.8). Its tools: " +
	strings.Join(mcp.ToolNames(), ", ") + " (--reply-only: reply alone; receive is listed only to a bridge below an attested Codex process).\n"

// mcpFlags: mcp runs the MCP bridge on stdin/stdout (docs/protocol.md §2.8, §10.2).
func mcpFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	httpFlag := fs.String("http-sock", "", "bus http.sock (env XMSG_HTTP_SOCK)")
	agentFlag := fs.String("agent-sock", "", "bus agent.sock (env XMSG_AGENT_SOCK)")
	replyOnlyEnv, _ := strconv.ParseBool(os.Getenv("XMSG_REPLY_ONLY"))
	replyOnly := fs.Bool("reply-only", replyOnlyEnv, "offer only the reply tool (env XMSG_REPLY_ONLY)")
	fs.String("sessions-dir", "", "accepted for compatibility; the bus discovers sessions")
	fs.String("xmsg-url", "", "accepted for compatibility; the bridge uses the sockets")
	// Arguments after the flags are ignored, as they always were: agents' configurations
	// written for the original bridge keep starting it.
	return func([]string) error {
		httpSock, err := sockPath("http", *httpFlag)
		if err != nil {
			return fmt.Errorf("mcp: %w", err)
		}
		agentSock, err := sockPath("agent", *agentFlag)
		if err != nil {
			return fmt.Errorf("mcp: %w", err)
		}
		return mcp.Run(context.Background(), mcp.Config{AgentSock: agentSock, HTTPSock: httpSock, ReplyOnly: *replyOnly,
			In: s.in, Out: s.out, Log: newLogger("warn", os.Stderr),
			// Antigravity runs its MCP servers with the conversation in the environment.
			AgyStart: os.Getenv("ANTIGRAVITY_CONVERSATION_ID") != ""})
	}
}
