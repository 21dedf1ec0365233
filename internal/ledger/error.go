package ledger

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// Error is a refusal with the protocol's code (docs/protocol.md §3.1, §4.1). Servers render it
// in their own wire shape; the HTTP status is the code's (Code.Status).
type Error struct {
	Code   Code
	Detail string // human text; never contains message bodies or secrets
	// PID is the live process a ref named, for code unregistered (0 otherwise): agent.sock
	// words its detail differently ("pid N is unregistered", docs/protocol.md §4.1).
	PID int
}

func (e *Error) Error() string { return e.Code.String() + ": " + e.Detail }

// Errorf is a refusal with code c.
func Errorf(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Detail: fmt.Sprintf(format, args...)}
}

// AsError returns err as an *Error. A full disk (ENOSPC, EDQUOT) becomes insufficient_storage
// and running out of descriptors or memory (EMFILE, ENFILE, ENOMEM) service_unavailable: both
// are conditions a client may retry, and in both nothing was stored. Anything else becomes
// internal (with a generic detail, so internal paths and causes don't leak to clients).
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	switch {
	case StorageFull(err):
		return &Error{Code: InsufficientStorage, Detail: "the store's disk is full; nothing was stored, retry later"}
	case OutOfResources(err):
		return &Error{Code: ServiceUnavailable, Detail: "out of file descriptors or memory; retry later"}
	}
	return &Error{Code: Internal, Detail: "internal error"}
}

// StorageFull reports whether err is a full disk or quota. bbolt flattens some of its errors
// to text ("file resize error: %s"), so the errno's message is matched as well.
func StorageFull(err error) bool {
	return errIs(err, syscall.ENOSPC, syscall.EDQUOT)
}

// OutOfResources reports whether err is running out of descriptors or memory: the work could
// not be attempted, which says nothing about what was asked for.
func OutOfResources(err error) bool {
	return errIs(err, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS)
}

func errIs(err error, errnos ...syscall.Errno) bool {
	if err == nil {
		return false
	}
	for _, n := range errnos {
		if errors.Is(err, n) || strings.Contains(err.Error(), n.Error()) {
			return true
		}
	}
	return false
}
