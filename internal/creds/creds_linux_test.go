//go:build linux

package creds

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const childEnv = "XMSG_CREDS_TEST_CHILD"

type childResult struct {
	Content string
	Source  Source
	Err     string
}

func TestMain(m *testing.M) {
	if name := os.Getenv(childEnv); name != "" {
		// Child: read one credential as whoever we were started as, report on stdout.
		b, src, err := Read(name, "")
		res := childResult{Content: string(b), Source: src}
		if err != nil {
			res.Err = err.Error()
		}
		if json.NewEncoder(os.Stdout).Encode(res) != nil {
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
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
	if os.Geteuid() != 0 {
		needs(t, "root")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		needs(t, "useradd")
	}
	name := "xmsgcred" + randHex(t, 4)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--user-group",
		"--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)

	// A directory the user can traverse, holding a copy of the test binary it can run.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "creds.test")
	copyFile(t, os.Args[0], bin, 0o755)
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
		cmd := exec.Command(bin)
		cmd.Env = []string{childEnv + "=" + tt.cred, "CREDENTIALS_DIRECTORY=" + credDir}
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

func needs(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("needs %s", what)
	}
	t.Skipf("needs %s", what)
}

func randHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(fmt.Errorf("close: %w", err))
	}
}
