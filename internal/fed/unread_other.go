//go:build !linux

package fed

import "net"

// unread is not known here: only what the handshake read counts.
func unread(net.Conn) bool { return false }
