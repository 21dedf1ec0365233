// Package systemd holds xmsg's systemd units and the sysusers.d/tmpfiles.d snippets that go
// with them. The Go package exists only for its tests: they check the invariants the daemon
// relies on (socket names, modes, owners, the tier user) by reading the files, and run
// systemd-analyze on the units (verify, and security with an exposure of at most 1.0), and on
// a federating tier's instance with the example drop-ins (verify, and security pinned to the
// three findings federation adds).
package systemd
