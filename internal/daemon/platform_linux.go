//go:build linux

package daemon

// platformSupported: on Linux the peer gate reads SO_PEERCRED (internal/peercred).
func platformSupported() error { return nil }
