package claude

import "github.com/xmsg/xmsg/internal/harness"

// Name is Claude Code's harness name.
const Name = "claude"

// Harness is Claude Code: sessions found by their session files, delivered to their inbox
// sockets; "session:<id>" is a Claude ref too.
var Harness harness.Harness = harness.Spec{ID: Name, Prefixes: []string{Name, "session"}, Admit: harness.SessionFile, Deliver: harness.Inbox}
