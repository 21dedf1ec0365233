package creds

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStamp: equal while nothing changes; a rewrite, a rename into place and a swap of a
// kubelet ..data link each give another stamp; a fresh file is racy.
func TestStamp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "peers")
	os.WriteFile(p, []byte("one"), 0o600)
	s1, err := StampOf("peers", p)
	if err != nil || s1 == (Stamp{}) {
		t.Fatalf("stamp: %+v %v", s1, err)
	}
	if s2, _ := StampOf("peers", p); s2 != s1 {
		t.Errorf("unchanged file: %+v then %+v", s1, s2)
	}
	if !s1.Racy(time.Now()) || s1.Racy(time.Now().Add(3*time.Second)) {
		t.Errorf("racy: a fresh file must be, one stamped 3 s later not")
	}
	os.WriteFile(p+".new", []byte("two"), 0o600)
	os.Rename(p+".new", p)
	if s2, _ := StampOf("peers", p); s2 == s1 {
		t.Error("a file renamed into place has the same stamp")
	}
	if s, err := StampOf("peers", filepath.Join(dir, "absent")); err != nil || s != (Stamp{}) {
		t.Errorf("absent: %+v %v, want the zero stamp", s, err)
	}
	// The kubelet's swap: name -> ..data/name, ..data -> ..ts1, then ..ts2.
	for _, ts := range []string{"..ts1", "..ts2"} {
		os.Mkdir(filepath.Join(dir, ts), 0o755)
		os.WriteFile(filepath.Join(dir, ts, "fed-cert"), []byte("same"), 0o400)
	}
	os.Symlink("..data/fed-cert", filepath.Join(dir, "fed-cert"))
	os.Symlink("..ts1", filepath.Join(dir, "..data"))
	k1, _ := StampOf("fed-cert", filepath.Join(dir, "fed-cert"))
	os.Symlink("..ts2", filepath.Join(dir, "..data_tmp"))
	os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data"))
	if k2, _ := StampOf("fed-cert", filepath.Join(dir, "fed-cert")); k2 == k1 {
		t.Error("a swap of ..data left the stamp as it was")
	}
}
