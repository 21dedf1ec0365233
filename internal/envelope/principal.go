package envelope

// PrincipalHarness reports whether h is a harness a federation session principal or replier
// may name (docs/protocol.md §8.2): the wire's set, what a peer may claim for its own
// sessions, which is not this daemon's harness registry (a Codex thread, say, has no
// federation principal of its own kind).
func PrincipalHarness(h string) bool {
	switch h {
	case "claude", "agy", "pi", "svc", "opencode", "hermes":
		return true
	}
	return false
}
