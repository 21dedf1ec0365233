//go:build !linux

package exehelper

import (
	"errors"

	"github.com/xmsg/xmsg/internal/peercred"
)

var errUnsupported = errors.New("exehelper: only supported on Linux")

// Client is unavailable off Linux, where there is no Landlock to work around.
type Client struct{}

// Start fails off Linux.
func Start(self string, env []string) (*Client, error) { return nil, errUnsupported }

// Exe fails off Linux.
func (c *Client) Exe(pid int) (string, error) { return "", errUnsupported }

// OpenFiles fails off Linux.
func (c *Client) OpenFiles(pid int) ([]peercred.OpenFile, error) { return nil, errUnsupported }

// ExeDigest fails off Linux.
func (c *Client) ExeDigest(pid int) (string, string, error) { return "", "", errUnsupported }

// Close does nothing.
func (c *Client) Close() error { return nil }

// Serve fails off Linux.
func Serve() error { return errUnsupported }
