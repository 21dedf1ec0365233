//go:build !unix

package fed

// descriptorLimit is unknown here: the budget falls back to its bound.
func descriptorLimit() uint64 { return 0 }
