//go:build !linux

package sandbox

import "log/slog"

// Probe returns 0: Landlock exists only on Linux.
func Probe() int { return 0 }

// Apply restricts nothing outside Linux. With p.Require it refuses, as on a Linux kernel
// without Landlock.
func Apply(p Policy, log *slog.Logger) (Report, error) {
	r := plan(0, false)
	if err := gate(p, r); err != nil {
		return Report{}, err
	}
	if log != nil {
		log.Warn("landlock unavailable", "reason", "not Linux")
	}
	return r, nil
}
