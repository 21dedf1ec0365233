package codex

import "github.com/xmsg/xmsg/internal/harness"

// Name is Codex's harness name.
const Name = "codex"

type codexHarness struct{ harness.Plain }

func (codexHarness) Name() string                 { return Name }
func (codexHarness) Refs() []string               { return []string{Name} }
func (codexHarness) Admission() harness.Admission { return harness.Lease }
func (codexHarness) Delivery() harness.Delivery   { return harness.Queue }
func (codexHarness) Rank() int                    { return 1 }

// Envelope says, outside the escaped body, that the text is peer data (Preamble).
func (codexHarness) Envelope(badge, claudeBody, _ string) string { return Envelope(badge, claudeBody) }

// Harness is Codex: thread leases attested by writer lock and _meta, queues polled on
// agent.sock.
var Harness harness.Harness = codexHarness{}
