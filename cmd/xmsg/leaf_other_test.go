//go:build !linux

package main

import "github.com/xmsg/xmsg/internal/ostest"

// leafRoles: the leaf end-to-end tests (leaf_e2e_test.go) need network namespaces, Linux only.
var leafRoles = ostest.Roles{}
