//go:build !linux

package main

// netcheck checks a systemd unit's network restrictions, which exist on Linux only.
func netcheck(r *report, _, _, _, _ []string, _ bool) {
	r.fail("netcheck", "systemd unit network restrictions exist on Linux only")
}
