//go:build !linux

package claude

import (
	"net"
	"time"
)

// Elsewhere every connection is made through the net package, by Write.
func connectNow(string) (int, error)       { return -1, errWouldBlock }
func writeNow(int, []byte) ([]byte, error) { panic("claude: no fd outside Linux") }
func adopt(int) (net.Conn, error)          { panic("claude: no fd outside Linux") }
func closeNow(int)                         {}

func dialWait(path string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("unix", path)
}
