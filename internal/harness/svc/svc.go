// Package svc is the service harness: a configured name whose process is attested by its
// executable (--svc-exe), with a durable queue that outlives its registration and entries
// that carry the sender's origin (docs/protocol.md §7).
package svc

import "github.com/xmsg/xmsg/internal/harness"

// Name is the harness's name, and the prefix of every service's session id ("svc:<name>").
const Name = "svc"

type svcHarness struct{ harness.Plain }

func (svcHarness) Name() string                 { return Name }
func (svcHarness) Refs() []string               { return []string{Name} }
func (svcHarness) Admission() harness.Admission { return harness.Exe }
func (svcHarness) Delivery() harness.Delivery   { return harness.Queue }
func (svcHarness) Kind() string                 { return "daemon" }
func (svcHarness) Rank() int                    { return 2 }
func (svcHarness) Origin() bool                 { return true }

// Harness is the service harness.
var Harness harness.Harness = svcHarness{}
