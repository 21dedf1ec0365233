//go:build !darwin

package activation

// fallbackRuntimeDir has no fallback outside macOS: a shared directory such
// as /tmp could already hold a directory planted by another user.
func fallbackRuntimeDir() string { return "" }
