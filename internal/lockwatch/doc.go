// Package lockwatch follows directories of lock files with inotify and reports each lock that
// goes away or is replaced. Harness leases (a Codex writer lock, an Antigravity presence
// lock) end through it the moment their lock does, rather than at the next request.
package lockwatch
