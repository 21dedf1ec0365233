//go:build linux

package creds

import (
	"os"
	"syscall"
)

func stampOf(fi os.FileInfo) Stamp {
	s := Stamp{Size: fi.Size(), Mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.Dev, s.Ino, s.Ctime = uint64(st.Dev), st.Ino, st.Ctim.Nano()
	}
	return s
}
