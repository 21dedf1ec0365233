// Package svc is the service harness: a configured name whose process is attested by its
// executable (--svc-exe), with a durable queue that outlives its registration and entries
// that carry the sender's origin (docs/protocol.md §7).
package svc

import "github.com/xmsg/xmsg/internal/harness"

// Name is the harness's name, and the prefix of every service's session id ("svc:<name>").
const Name = "svc"

// Harness is the service harness.
var Harness harness.Harness = harness.Spec{ID: Name, Admit: harness.Exe, Deliver: harness.Queue, Daemon: true, Order: 2, Origins: true}

// SessionID is the session id of the service named name.
func SessionID(name string) string { return Name + ":" + name }
