package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/xmsg/xmsg/internal/mcp"
)

// mcpCmd runs the MCP bridge on stdin/stdout (docs/protocol.md §2.8, §10.2).
func mcpCmd(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	httpFlag := fs.String("http-sock", "", "bus http.sock (env XMSG_HTTP_SOCK)")
	agentFlag := fs.String("agent-sock", "", "bus agent.sock (env XMSG_AGENT_SOCK)")
	replyOnlyEnv, _ := strconv.ParseBool(os.Getenv("XMSG_REPLY_ONLY"))
	replyOnly := fs.Bool("reply-only", replyOnlyEnv, "offer only the reply tool (env XMSG_REPLY_ONLY)")
	fs.String("sessions-dir", "", "accepted for compatibility; the bus discovers sessions")
	fs.String("xmsg-url", "", "accepted for compatibility; the bridge uses the sockets")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, "usage: xmsg mcp [flags]\n\nMCP bridge on stdin/stdout for an agent session (tools: list, send, reply; receive below Codex).\n\n")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		return usageError{fmt.Sprintf("mcp: %v", err)}
	}
	httpSock, err := sockPath("http", *httpFlag)
	if err != nil {
		return fmt.Errorf("mcp: %w", err)
	}
	agentSock, err := sockPath("agent", *agentFlag)
	if err != nil {
		return fmt.Errorf("mcp: %w", err)
	}
	return mcp.Run(context.Background(), mcp.Config{AgentSock: agentSock, HTTPSock: httpSock, ReplyOnly: *replyOnly,
		In: stdin, Out: stdout, Log: newLogger("warn", os.Stderr), Version: version,
		// Antigravity runs its MCP servers with the conversation in the environment.
		AgyStart: os.Getenv("ANTIGRAVITY_CONVERSATION_ID") != ""})
}
