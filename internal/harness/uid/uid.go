// Package uid is the harnesses admitted on register.sock by uid alone: pi, opencode and
// hermes. Their sessions get a durable id per process (boot id, pid, start time) and poll
// their queue on their register.sock connection.
package uid

import "github.com/xmsg/xmsg/internal/harness"

type uidHarness struct {
	harness.Plain
	name string
}

func (h uidHarness) Name() string               { return h.name }
func (h uidHarness) Refs() []string             { return []string{h.name} }
func (uidHarness) Admission() harness.Admission { return harness.UID }
func (uidHarness) Delivery() harness.Delivery   { return harness.Queue }
func (uidHarness) Rank() int                    { return 1 }

// New returns a uid-admitted harness named name (a test adds its own with one call).
func New(name string) harness.Harness { return uidHarness{name: name} }

// The uid-admitted harnesses.
var (
	Pi       = New("pi")
	OpenCode = New("opencode")
	Hermes   = New("hermes")
)
