// Package uid is the harnesses admitted on register.sock by uid alone: pi, opencode,
// hermes, and cli (`xmsg listen`, a terminal as a session). Their sessions get a durable id per process (boot id, pid, start time) and poll
// their queue on their register.sock connection.
package uid

import "github.com/xmsg/xmsg/internal/harness"

// New returns a uid-admitted harness named name.
func New(name string) harness.Harness {
	return harness.Spec{ID: name, Admit: harness.UID, Deliver: harness.Queue, Order: 1}
}

// The uid-admitted harnesses.
var (
	Pi       = New("pi")
	OpenCode = New("opencode")
	Hermes   = New("hermes")
	// CLI is `xmsg listen NAME`: a person or a script at a terminal, with no agent at all.
	CLI = New("cli")
)
