//go:build !linux

package claude

import (
	"errors"
	"log/slog"

	"github.com/xmsg/xmsg/internal/peercred"
)

// Reports is unavailable off Linux (no peer credentials to check a report's writer by).
type Reports struct{}

// ListenReports fails off Linux.
func ListenReports(path string, log *slog.Logger) (*Reports, error) {
	return nil, errors.New("claude: reply socket only on linux")
}

// Path is "".
func (r *Reports) Path() string { return "" }

// Serve returns at once.
func (r *Reports) Serve(handle func(peercred.Cred, Report)) error { return nil }

// Close does nothing.
func (r *Reports) Close() error { return nil }
