package agy

import "github.com/xmsg/xmsg/internal/harness"

// Name is Antigravity's harness name.
const Name = "agy"

// Harness is Antigravity: conversations attested by their flocked presence lock, reached
// through agentapi (or their conversation's queue until credentials arrive).
var Harness harness.Harness = harness.Spec{ID: Name, Admit: harness.Presence, Deliver: harness.Agentapi}
