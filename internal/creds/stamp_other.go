//go:build !linux

package creds

import "os"

// stampOf without the inode and change time: size and modification time only.
func stampOf(fi os.FileInfo) Stamp { return Stamp{Size: fi.Size(), Mtime: fi.ModTime().UnixNano()} }
