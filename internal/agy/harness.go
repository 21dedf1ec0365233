package agy

import "github.com/xmsg/xmsg/internal/harness"

// Name is Antigravity's harness name.
const Name = "agy"

type agyHarness struct{ harness.Plain }

func (agyHarness) Name() string                 { return Name }
func (agyHarness) Refs() []string               { return []string{Name} }
func (agyHarness) Admission() harness.Admission { return harness.Presence }
func (agyHarness) Delivery() harness.Delivery   { return harness.Agentapi }
func (agyHarness) Rank() int                    { return 0 }

// Harness is Antigravity: conversations attested by their flocked presence lock, reached
// through agentapi.
var Harness harness.Harness = agyHarness{}
