package creds

import (
	"os"
	"path/filepath"
	"strings"
)

// Kubernetes delivers a Secret volume (the federation credentials of a leaf in a pod) with
// the kubelet's atomic-writer layout, which the checks above would refuse twice:
//
//	<dir>/fed-cert -> ..data/fed-cert
//	<dir>/..data   -> ..2026_12_01_10_00_00.123456789
//	<dir>/..2026_12_01_10_00_00.123456789/fed-cert   root-owned, group fsGroup, mode 0440
//
// (a symlink, and group-readable so that the pod's non-root uid can read it). That exact
// shape is accepted, in $CREDENTIALS_DIRECTORY or in the directory of a path a flag names
// (--fed-cert /etc/xmsg/secret/fed-cert): the name must be a symlink to
// "..data/<name>", "..data" a symlink to one "..<something>" entry beside it, the file is
// opened beneath the directory with symlinks resolved inside it only (openat2
// RESOLVE_BENEATH; Linux), and its group may read it only when that group is this process's
// own (the pod's fsGroup) and nobody else can: mode 0440 or 0400, no ACL, owner root or us.

// kubeLayout reports whether dir/name is a kubelet atomic-writer entry (see above).
func kubeLayout(dir, name string) bool {
	target, err := os.Readlink(filepath.Join(dir, name))
	if err != nil || target != "..data/"+name {
		return false
	}
	data, err := os.Readlink(filepath.Join(dir, "..data"))
	return err == nil && strings.HasPrefix(data, "..") && data != ".." && !strings.ContainsRune(data, '/')
}

// ownGroup reports whether gid is this process's group or one of its supplementary groups.
func ownGroup(gid uint32) bool {
	if uint32(os.Getegid()) == gid {
		return true
	}
	groups, err := os.Getgroups()
	if err != nil {
		return false
	}
	for _, g := range groups {
		if uint32(g) == gid {
			return true
		}
	}
	return false
}
