package claude

import "github.com/xmsg/xmsg/internal/harness"

// Name is Claude Code's harness name.
const Name = "claude"

type claudeHarness struct{ harness.Plain }

func (claudeHarness) Name() string                 { return Name }
func (claudeHarness) Refs() []string               { return []string{Name, "session"} }
func (claudeHarness) Admission() harness.Admission { return harness.SessionFile }
func (claudeHarness) Delivery() harness.Delivery   { return harness.Inbox }
func (claudeHarness) Rank() int                    { return 0 }

// Harness is Claude Code: sessions found by their session files, delivered to their inbox
// sockets.
var Harness harness.Harness = claudeHarness{}
