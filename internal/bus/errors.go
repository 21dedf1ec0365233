package bus

import (
	"fmt"

	"github.com/xmsg/xmsg/internal/ledger"
)

// Error is a refusal with the protocol's code: ledger's, where the codes and their statuses
// are one table. The bus names refusals by code only.
type Error = ledger.Error

// AsError returns err as an *Error (ledger.AsError).
func AsError(err error) *Error { return ledger.AsError(err) }

func errorf(code ledger.Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *Error {
	return errorf(ledger.BadRequest, format, args...)
}

func notFound(what string) *Error {
	return errorf(ledger.NotFound, "no live session matches '%s'", what)
}

// unregistered is a ref naming a live process that is no attested session.
func unregistered(pid int) *Error {
	e := errorf(ledger.Unregistered, "process %d has no attested agent session", pid)
	e.PID = pid
	return e
}
