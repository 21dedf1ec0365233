//go:build !linux

package sandbox

// SelfCheck has nothing to check where Landlock does not exist.
func SelfCheck(r Report, p Policy) (string, error) {
	return "landlock self-check: nothing enforced to check", nil
}
