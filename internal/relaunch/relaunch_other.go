//go:build !linux

package relaunch

import (
	"errors"
	"os"
)

var errUnsupported = errors.New("relaunch: only on linux")

// Watch is not available off Linux.
type Watch struct{}

func NewWatch([]string) (*Watch, map[string]error, error) { return nil, nil, errUnsupported }
func (w *Watch) C() <-chan string                         { return nil }
func (w *Watch) Close() error                             { return nil }

// Handover is not available off Linux.
type Handover struct{}

func Prepare(string, []string, []*os.File, []string) (*Handover, error) { return nil, errUnsupported }
func Inherited() *Handover                                              { return nil }
func (h *Handover) Done() <-chan struct{}                               { return nil }
func (h *Handover) Go(string) error                                     { return errUnsupported }
func (h *Handover) Wait() int                                           { return 1 }
func (h *Handover) Close() error                                        { return nil }
func RunHelper([]string) (int, error)                                   { return 1, errUnsupported }

// FollowGoRun does nothing off Linux.
func FollowGoRun(func(int) (string, error)) bool { return false }
