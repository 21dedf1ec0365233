package creds

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
)

const secret = "SECRET-CONTENT-7f3a"

func write(t *testing.T, path string, content []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func TestReadPath(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	big := bytes.Repeat([]byte("x"), MaxSize+1)
	max := bytes.Repeat([]byte("y"), MaxSize)
	tests := []struct {
		name    string
		setup   func(t *testing.T, path string) // creates path
		want    []byte                          // nil when an error is expected
		wantErr string
	}{
		{"mode 0600", func(t *testing.T, p string) { write(t, p, []byte(secret), 0o600) }, []byte(secret), ""},
		{"mode 0400", func(t *testing.T, p string) { write(t, p, []byte(secret), 0o400) }, []byte(secret), ""},
		{"empty", func(t *testing.T, p string) { write(t, p, nil, 0o600) }, []byte{}, ""},
		{"exactly MaxSize", func(t *testing.T, p string) { write(t, p, max, 0o600) }, max, ""},
		{"larger than MaxSize", func(t *testing.T, p string) { write(t, p, big, 0o600) }, nil, "larger than 1048576 bytes"},
		{"group readable", func(t *testing.T, p string) { write(t, p, []byte(secret), 0o640) }, nil, "group or others (mode 0640"},
		{"world readable", func(t *testing.T, p string) { write(t, p, []byte(secret), 0o604) }, nil, "group or others (mode 0604"},
		{"group writable", func(t *testing.T, p string) { write(t, p, []byte(secret), 0o620) }, nil, "group or others"},
		{"world executable", func(t *testing.T, p string) { write(t, p, []byte(secret), 0o601) }, nil, "group or others"},
		{"symlink to a good file", func(t *testing.T, p string) {
			target := p + ".target"
			write(t, target, []byte(secret), 0o600)
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}, nil, "is a symlink"},
		{"directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}, nil, "not a regular file"},
		{"fifo (must not block)", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}, nil, "not a regular file"},
		{"missing", func(t *testing.T, p string) {}, nil, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fed-key")
			tt.setup(t, path)
			got, src, err := Read("fed-key", path)
			if src != SourcePath {
				t.Errorf("source = %q, want %q", src, SourcePath)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				checkErrorText(t, err)
				if got != nil {
					t.Errorf("content returned with an error")
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v, want nil", err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Errorf("content = %d bytes, want %d", len(got), len(tt.want))
			}
		})
	}
}

// checkErrorText: an error names the credential and never carries its content.
func checkErrorText(t *testing.T, err error) {
	t.Helper()
	if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "xxxx") {
		t.Errorf("error %q contains credential content", err)
	}
	if !strings.Contains(err.Error(), "fed-key") {
		t.Errorf("error %q does not name the credential", err)
	}
}

func TestReadOwner(t *testing.T) {
	ostest.Need(t, os.Geteuid() == 0, "root, to chown")
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	path := filepath.Join(t.TempDir(), "fed-key")
	write(t, path, []byte(secret), 0o400)
	// Root reads it regardless of the owner; the owner check must still refuse it.
	if err := os.Chown(path, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	_, _, err := Read("fed-key", path)
	if err == nil || !strings.Contains(err.Error(), "owned by uid 54321") {
		t.Fatalf("err = %v, want a refusal naming owner uid 54321", err)
	}
	checkErrorText(t, err)
}

func TestReadSources(t *testing.T) {
	credDir := t.TempDir()
	other := t.TempDir()
	write(t, filepath.Join(credDir, "fed-cert"), []byte("from-dir"), 0o400)
	write(t, filepath.Join(credDir, "fed-key"), []byte(secret), 0o644) // bad mode
	fallback := filepath.Join(other, "fallback")
	write(t, fallback, []byte("from-path"), 0o600)

	tests := []struct {
		desc, dir, name, fallback string
		want                      string
		wantSrc                   Source
		wantErr                   string
	}{
		{"dir wins over path", credDir, "fed-cert", fallback, "from-dir", SourceCredentialsDirectory, ""},
		{"dir without path", credDir, "fed-cert", "", "from-dir", SourceCredentialsDirectory, ""},
		{"not in dir: path", credDir, "fed-ca", fallback, "from-path", SourcePath, ""},
		{"not in dir, no path: none", credDir, "fed-ca", "", "", SourceNone, ""},
		{"bad file in dir never falls through", credDir, "fed-key", fallback, "", SourceCredentialsDirectory, "group or others"},
		{"no dir: path", "", "fed-cert", fallback, "from-path", SourcePath, ""},
		{"no dir, no path: none", "", "fed-cert", "", "", SourceNone, ""},
		{"named path missing", "", "fed-cert", filepath.Join(other, "missing"), "", SourcePath, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			t.Setenv("CREDENTIALS_DIRECTORY", tt.dir)
			if got := Dir(); got != tt.dir {
				t.Errorf("Dir() = %q, want %q", got, tt.dir)
			}
			got, src, err := Read(tt.name, tt.fallback)
			if src != tt.wantSrc {
				t.Errorf("source = %q, want %q", src, tt.wantSrc)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "SECRET") {
					t.Errorf("error %q contains credential content", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			if string(got) != tt.want || (tt.want == "" && got != nil) {
				t.Errorf("content = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestReadInvalidName(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "peers"), []byte("x"), 0o600)
	t.Setenv("CREDENTIALS_DIRECTORY", filepath.Join(dir, "sub"))
	for _, name := range []string{"", ".", "..", "../peers", "a/b", "/etc/shadow"} {
		if _, _, err := Read(name, ""); err == nil || !strings.Contains(err.Error(), "invalid credential name") {
			t.Errorf("Read(%q) err = %v, want invalid credential name", name, err)
		}
	}
}

// encodeACL is the inverse of parseACL.
func encodeACL(entries []aclEntry) []byte {
	b := binary.LittleEndian.AppendUint32(nil, aclVersion)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

const undefinedID = 0xffffffff // ACL_UNDEFINED_ID, the id of the non-named entries

// systemdACL is what systemd ≥ 255 sets on a credential: user::r, user:<uid>:r,
// group::-, mask::r, other::-.
func systemdACL(uid uint32) []aclEntry {
	return []aclEntry{
		{aclUserObj, 4, undefinedID},
		{aclUser, 4, uid},
		{aclGroupObj, 0, undefinedID},
		{aclMask, 4, undefinedID},
		{aclOther, 0, undefinedID},
	}
}

func TestCheckACL(t *testing.T) {
	const self = 1000
	tests := []struct {
		desc    string
		entries []aclEntry
		wantErr string
	}{
		{"systemd shape", systemdACL(self), ""},
		{"another named user", systemdACL(1001), "uid 1001"},
		{"another named user masked out", []aclEntry{
			{aclUserObj, 6, undefinedID}, {aclUser, 4, 1001}, {aclGroupObj, 0, undefinedID},
			{aclMask, 0, undefinedID}, {aclOther, 0, undefinedID}}, ""},
		{"group readable", []aclEntry{
			{aclUserObj, 4, undefinedID}, {aclUser, 4, self}, {aclGroupObj, 4, undefinedID},
			{aclMask, 4, undefinedID}, {aclOther, 0, undefinedID}}, "its group"},
		{"named group", []aclEntry{
			{aclUserObj, 4, undefinedID}, {aclGroupObj, 0, undefinedID}, {aclGroup, 4, 50},
			{aclMask, 4, undefinedID}, {aclOther, 0, undefinedID}}, "gid 50"},
		{"others, not limited by the mask", []aclEntry{
			{aclUserObj, 4, undefinedID}, {aclUser, 4, self}, {aclGroupObj, 0, undefinedID},
			{aclMask, 0, undefinedID}, {aclOther, 4, undefinedID}}, "others"},
		{"others execute", []aclEntry{
			{aclUserObj, 4, undefinedID}, {aclGroupObj, 0, undefinedID}, {aclOther, 1, undefinedID}}, "others"},
	}
	for _, tt := range tests {
		err := checkACL(tt.entries, self)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: err = %v, want nil", tt.desc, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: err = %v, want containing %q", tt.desc, err, tt.wantErr)
		}
	}
}

func TestParseACL(t *testing.T) {
	good := encodeACL(systemdACL(1000))
	got, err := parseACL(good)
	if err != nil {
		t.Fatalf("parseACL(systemd shape) = %v", err)
	}
	if want := systemdACL(1000); len(got) != len(want) || got[1] != want[1] {
		t.Errorf("parseACL = %+v, want %+v", got, want)
	}
	bad := [][]byte{
		nil,
		{2, 0, 0},
		{2, 0, 0, 0},                         // no entries
		{1, 0, 0, 0, 1, 0, 4, 0, 0, 0, 0, 0}, // version 1
		{2, 0, 0, 0, 1, 0, 4, 0, 0, 0, 0},    // truncated entry
		{2, 0, 0, 0, 0x40, 0, 4, 0, 0xff, 0xff, 0xff, 0xff}, // unknown tag
	}
	for _, b := range bad {
		if _, err := parseACL(b); err == nil {
			t.Errorf("parseACL(%x) = nil error, want one", b)
		}
	}
}

func FuzzParseACL(f *testing.F) {
	f.Add(encodeACL(systemdACL(1000)))
	f.Add(encodeACL([]aclEntry{{aclUserObj, 7, undefinedID}, {aclGroupObj, 0, undefinedID}, {aclOther, 0, undefinedID}}))
	f.Add([]byte{})
	f.Add([]byte{2, 0, 0, 0})
	f.Add([]byte{2, 0, 0, 0, 0x40, 0, 4, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := parseACL(b)
		if err != nil {
			return
		}
		// Round trip: what parses re-encodes to the same bytes.
		if enc := encodeACL(entries); !bytes.Equal(enc, b) {
			t.Fatalf("round trip: %x -> %+v -> %x", b, entries, enc)
		}
		_ = checkACL(entries, 1000) // must not panic
	})
}
