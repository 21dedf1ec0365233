package codex

import "github.com/xmsg/xmsg/internal/harness"

// Name is Codex's harness name.
const Name = "codex"

// codexHarness is a Spec whose queued envelope carries the preamble.
type codexHarness struct{ harness.Spec }

// Envelope says, outside the escaped body, that the text is peer data (Preamble).
func (codexHarness) Envelope(badge, claudeBody, _ string) string { return Envelope(badge, claudeBody) }

// Harness is Codex: thread leases attested by writer lock and _meta, queues polled on
// agent.sock.
var Harness harness.Harness = codexHarness{harness.Spec{ID: Name, Admit: harness.Lease, Deliver: harness.Queue, Order: 1}}
