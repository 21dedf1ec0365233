// Package docs holds xmsg's own documentation: the wire protocol as this daemon speaks it
// (protocol.md), its design (design.md), its security model (security.md) and the operator's
// guide (operations.md). The Go package exists only for its tests: every section a comment
// cites exists, nothing points outside the repository, the README's Layout matches the tree,
// and the units' Documentation= names files that are installed.
package docs
