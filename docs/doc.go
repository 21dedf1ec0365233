// Package docs holds xmsg's own documentation: the wire protocol as this daemon speaks it
// (protocol.md), its design (design.md), its security model (security.md), the operator's
// guide (operations.md) and the performance figures (performance.md). The Go package exists
// only for its tests: every section a comment cites exists, nothing points outside the
// repository, design.md §1 maps the tree, the README stays a front page, the tests
// security.md names exist, performance.md shows the bench's own report, and the units'
// Documentation= names files that are installed.
package docs
