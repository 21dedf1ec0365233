//go:build !linux

package inq

func queued(uintptr) int { return 0 }
