//go:build !linux

package daemon

// nonDumpable has nothing to do where custody is unavailable (Load fails first).
func nonDumpable() error { return nil }
