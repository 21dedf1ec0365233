//go:build linux

package creds

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/ostest"
)

const childEnv = "XMSG_CREDS_TEST_CHILD" // the credential the "reader" child reads

type childResult struct {
	Content string
	Source  Source
	Err     string
}

func TestMain(m *testing.M) {
	ostest.Main(m, ostest.Roles{"reader": func() int {
		// Read one credential as whoever we were started as, report on stdout.
		b, src, err := Read(os.Getenv(childEnv), "")
		res := childResult{Content: string(b), Source: src}
		if err != nil {
			res.Err = err.Error()
		}
		if json.NewEncoder(os.Stdout).Encode(res) != nil {
			return 2
		}
		return 0
	}})
}

func setACL(t *testing.T, path string, entries []aclEntry) {
	t.Helper()
	err := unix.Setxattr(path, "system.posix_acl_access", encodeACL(entries), 0)
	if errors.Is(err, unix.ENOTSUP) {
		t.Skipf("no POSIX ACLs on the filesystem of %s", path)
	}
	if err != nil {
		t.Fatalf("setxattr: %v", err)
	}
}

// TestReadACL uses real ACLs: with one, the mode's group bits are the ACL mask (0440 for
// systemd's shape), so the ACL decides.
func TestReadACL(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	self := uint32(os.Geteuid())
	tests := []struct {
		desc    string
		entries []aclEntry
		wantErr string
	}{
		{"systemd shape for this uid", systemdACL(self), ""},
		{"readable by another uid", systemdACL(self + 54321), "accessible by uid"},
		{"readable by the group", []aclEntry{
			{aclUserObj, 4, undefinedID}, {aclUser, 4, self}, {aclGroupObj, 4, undefinedID},
			{aclMask, 4, undefinedID}, {aclOther, 0, undefinedID}}, "its group"},
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fed-key")
			write(t, path, []byte(secret), 0o400)
			setACL(t, path, tt.entries)
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm()&0o070 == 0 {
				t.Fatalf("mode %v after setting the ACL: want group bits from the mask", fi.Mode())
			}
			got, _, err := Read("fed-key", path)
			if tt.wantErr == "" {
				if err != nil || string(got) != secret {
					t.Fatalf("Read = %d bytes, %v; want the content", len(got), err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
			}
			checkErrorText(t, err)
		})
	}
}

// TestReadAsServiceUser reproduces both systemd delivery shapes for a real unprivileged
// user (the tier user) and a file that user can read but must refuse.
func TestReadAsServiceUser(t *testing.T) {
	u := ostest.AddUser(t)
	uid, gid := int(u.UID), int(u.GID)

	// A directory the user can traverse, holding a copy of the test binary it can run.
	dir, bin := ostest.WorldExe(t, "creds.test")
	credDir := filepath.Join(dir, "credentials")
	if err := os.Mkdir(credDir, 0o755); err != nil {
		t.Fatal(err)
	}

	// systemd ≥ 255 on tmpfs: root-owned, 0440 through an ACL for the service uid.
	acl := filepath.Join(credDir, "acl-shape")
	write(t, acl, []byte("acl-"+secret), 0o400)
	setACL(t, acl, systemdACL(uint32(uid)))
	// systemd 252 on ramfs: owned by the service user, 0400.
	owned := filepath.Join(credDir, "owned-shape")
	write(t, owned, []byte("owned-"+secret), 0o400)
	if err := os.Chown(owned, uid, gid); err != nil {
		t.Fatal(err)
	}
	// Root-owned, readable through the user's group: the user can read it, and must not.
	group := filepath.Join(credDir, "group-readable")
	write(t, group, []byte("group-"+secret), 0o440)
	if err := os.Chown(group, 0, gid); err != nil {
		t.Fatal(err)
	}
	// Owned by the user but world-readable.
	world := filepath.Join(credDir, "world-readable")
	write(t, world, []byte("world-"+secret), 0o444)
	if err := os.Chown(world, uid, gid); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		cred, want, wantErr string
	}{
		{"acl-shape", "acl-" + secret, ""},
		{"owned-shape", "owned-" + secret, ""},
		{"group-readable", "", "group or others (mode 0440"},
		{"world-readable", "", "group or others (mode 0444"},
	}
	for _, tt := range tests {
		cmd := ostest.Command(bin, "reader")
		// Nothing of ours but the role: the child sees only what the test gives it.
		cmd.Env = []string{ostest.Role("reader"), childEnv + "=" + tt.cred, "CREDENTIALS_DIRECTORY=" + credDir}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: child: %v", tt.cred, err)
		}
		var res childResult
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("%s: child output %q: %v", tt.cred, out, err)
		}
		if res.Source != SourceCredentialsDirectory {
			t.Errorf("%s: source %q, want %q", tt.cred, res.Source, SourceCredentialsDirectory)
		}
		if tt.wantErr != "" {
			if !strings.Contains(res.Err, tt.wantErr) || res.Content != "" {
				t.Errorf("%s: err %q content %d bytes, want a refusal containing %q", tt.cred, res.Err, len(res.Content), tt.wantErr)
			}
			if strings.Contains(res.Err, "SECRET") {
				t.Errorf("%s: error %q contains credential content", tt.cred, res.Err)
			}
			continue
		}
		if res.Err != "" || res.Content != tt.want {
			t.Errorf("%s: err %q content %q, want %q", tt.cred, res.Err, res.Content, tt.want)
		}
	}
}
