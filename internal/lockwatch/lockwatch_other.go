//go:build !linux

package lockwatch

import (
	"errors"
	"log/slog"
)

var errUnsupported = errors.New("lockwatch: only supported on linux")

// Watcher is unavailable off Linux.
type Watcher struct{}

// New fails off Linux: no lease can be followed, so none is granted.
func New(gone func(dir, name string), log *slog.Logger) (*Watcher, error) {
	return nil, errUnsupported
}

// Watch fails off Linux.
func (w *Watcher) Watch(dir string) error { return errUnsupported }

// Close does nothing.
func (w *Watcher) Close() error { return nil }
