package bus

import (
	"errors"
	"fmt"
	"net/http"
)

// Error is a refusal with the protocol's status and code (docs/protocol.md §3.1, §4.1). Servers
// render it in their own wire shape.
type Error struct {
	Status int    // HTTP status
	Code   string // protocol error code
	Detail string // human text; never contains message bodies or secrets
	// PID is the live process a ref named, for code unregistered (0 otherwise): agent.sock
	// words its detail differently ("pid N is unregistered", docs/protocol.md §4.1).
	PID int
}

func (e *Error) Error() string { return e.Code + ": " + e.Detail }

func errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Detail: fmt.Sprintf(format, args...)}
}

// AsError returns err as an *Error; anything else becomes 500 internal (with a generic
// detail, so internal paths and causes don't leak to clients).
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Status: http.StatusInternalServerError, Code: "internal", Detail: "internal error"}
}

func badRequest(format string, args ...any) *Error {
	return errorf(http.StatusBadRequest, "bad_request", format, args...)
}

func notFound(what string) *Error {
	return errorf(http.StatusNotFound, "not_found", "no live session matches '%s'", what)
}

// unregistered is a ref naming a live process that is no attested session.
func unregistered(pid int) *Error {
	e := errorf(http.StatusBadRequest, "unregistered", "process %d has no attested agent session", pid)
	e.PID = pid
	return e
}
