package bus

import "github.com/xmsg/xmsg/internal/harness/svc"

// Service returns the service registration a caller was attributed to (a process below a
// registered service, found by the ancestor walk), or nil for any other caller. Custody hands
// a service's secrets to such a descendant (agent.sock's credential frame).
func (c Caller) Service() *Registration {
	if c.Harness != svc.Name {
		return nil
	}
	return c.reg
}
