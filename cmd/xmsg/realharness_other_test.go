//go:build !linux

package main

import "github.com/xmsg/xmsg/internal/ostest"

// realHarnessRoles: the real-harness tests need network namespaces, Linux only.
var realHarnessRoles = ostest.Roles{}
