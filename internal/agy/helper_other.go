//go:build !linux

package agy

import "errors"

// HelperArg is the hidden subcommand of the agentapi helper.
const HelperArg = "__agy-helper"

var errUnsupported = errors.New("agy: only supported on linux")

// Helper is unavailable off Linux.
type Helper struct{}

// StartHelper fails off Linux.
func StartHelper(self, bin string, env []string) (*Helper, error) { return nil, errUnsupported }

// Send fails off Linux.
func (h *Helper) Send(c Credentials, title, envelope string) (Outcome, error) {
	return Failed, errUnsupported
}

// Close does nothing.
func (h *Helper) Close() error { return nil }

// ServeHelper fails off Linux.
func ServeHelper(bin string) error { return errUnsupported }
