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

// kubeVolume lays out a Secret volume as the kubelet's atomic writer does (kube.go): each
// name a symlink to ..data/<name>, ..data a symlink to the timestamped directory holding the
// files, root-owned, group gid, mode mode.
func kubeVolume(t *testing.T, parent string, gid int, mode os.FileMode, files map[string]string) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, "secret")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	const ts = "..2026_12_01_10_00_00.123456789"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		p := filepath.Join(dir, ts, name)
		write(t, p, []byte(content), mode)
		if err := os.Chown(p, 0, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("..data/"+name, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReadKubernetesSecret: a leaf in a pod reads its credentials from a Secret volume,
// read through the pod's fsGroup by a non-root uid (the real user here). Only that exact
// shape is accepted.
func TestReadKubernetesSecret(t *testing.T) {
	u := ostest.AddUser(t)
	dir, bin := ostest.WorldExe(t, "creds.test")
	read := func(credDir, name string) childResult {
		t.Helper()
		cmd := ostest.Command(bin, "reader")
		cmd.Env = []string{ostest.Role("reader"), childEnv + "=" + name, "CREDENTIALS_DIRECTORY=" + credDir}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: child: %v", name, err)
		}
		var res childResult
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("%s: child output %q: %v", name, out, err)
		}
		return res
	}
	good := kubeVolume(t, dir, int(u.GID), 0o440, map[string]string{"fed-cert": "kube-" + secret})
	if res := read(good, "fed-cert"); res.Err != "" || res.Content != "kube-"+secret || res.Source != SourceCredentialsDirectory {
		t.Errorf("the kubelet's shape (0440 root:fsGroup): %+v, want it read", res)
	}
	for _, tt := range []struct {
		mode    os.FileMode
		wantErr string
	}{{0o444, "group or others (mode 0444"}, {0o460, "group or others (mode 0460"}, {0o441, "group or others (mode 0441"}} {
		vol := kubeVolume(t, dir, int(u.GID), tt.mode, map[string]string{"fed-key": "kube-" + secret})
		if res := read(vol, "fed-key"); !strings.Contains(res.Err, tt.wantErr) || res.Content != "" || strings.Contains(res.Err, "SECRET") {
			t.Errorf("mode %04o in the kubelet's shape: %+v, want a refusal containing %q", tt.mode, res, tt.wantErr)
		}
	}

	// In this process (root, which could open anything): a group that is not ours.
	t.Setenv("CREDENTIALS_DIRECTORY", kubeVolume(t, dir, 54321, 0o440, map[string]string{"peers": "x"}))
	if _, _, err := Read("peers", ""); err == nil || !strings.Contains(err.Error(), "group or others") {
		t.Errorf("group 54321 (not ours): %v, want refused", err)
	}
	// Links out of the volume: an absolute ..data is not the kubelet's shape (a plain
	// symlink, refused), and a ..<x> entry that itself leaves the volume fails beneath it.
	outside := t.TempDir()
	write(t, filepath.Join(outside, "peers"), []byte("outside"), 0o400)
	abs := kubeVolume(t, dir, 0, 0o400, map[string]string{"peers": "x"})
	os.Remove(filepath.Join(abs, "..data"))
	os.Symlink(outside, filepath.Join(abs, "..data"))
	t.Setenv("CREDENTIALS_DIRECTORY", abs)
	if b, _, err := Read("peers", ""); err == nil || !strings.Contains(err.Error(), "symlink (refused)") {
		t.Errorf("..data -> %s: %q %v, want refused", outside, b, err)
	}
	hop := kubeVolume(t, dir, 0, 0o400, map[string]string{"peers": "x"})
	os.Remove(filepath.Join(hop, "..data"))
	os.Symlink("..hop", filepath.Join(hop, "..data"))
	os.Symlink(outside, filepath.Join(hop, "..hop"))
	t.Setenv("CREDENTIALS_DIRECTORY", hop)
	if b, _, err := Read("peers", ""); err == nil || !strings.Contains(err.Error(), "beneath") {
		t.Errorf("..data -> ..hop -> %s: %q %v, want refused beneath the volume", outside, b, err)
	}
	// The same shape named by a flag's path (the Secret mounted where --fed-cert points) is
	// read by the same rule; a swap of ..data is what the next read sees.
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	flagVol := kubeVolume(t, dir, 0, 0o400, map[string]string{"fed-cert": "first"})
	if b, src, err := Read("fed-cert", filepath.Join(flagVol, "fed-cert")); err != nil || string(b) != "first" || src != SourcePath {
		t.Errorf("the kubelet's shape named by a flag: %q %v %v, want it read", b, src, err)
	}
	const ts2 = "..2026_12_01_11_00_00.000000001"
	os.Mkdir(filepath.Join(flagVol, ts2), 0o755)
	write(t, filepath.Join(flagVol, ts2, "fed-cert"), []byte("second"), 0o400)
	os.Symlink(ts2, filepath.Join(flagVol, "..data_tmp"))
	if err := os.Rename(filepath.Join(flagVol, "..data_tmp"), filepath.Join(flagVol, "..data")); err != nil {
		t.Fatal(err)
	}
	if b, _, err := Read("fed-cert", filepath.Join(flagVol, "fed-cert")); err != nil || string(b) != "second" {
		t.Errorf("after the kubelet swapped ..data: %q %v, want the new content", b, err)
	}
	// Other symlinks named by a flag stay refused: a link out of its directory, and the
	// kubelet's names with an escaping ..data.
	os.Symlink(filepath.Join(outside, "peers"), filepath.Join(dir, "plain-link"))
	if _, _, err := Read("peers", filepath.Join(dir, "plain-link")); err == nil || !strings.Contains(err.Error(), "symlink (refused)") {
		t.Errorf("a plain symlink named by a flag: %v, want refused", err)
	}
	if b, _, err := Read("peers", filepath.Join(hop, "peers")); err == nil || !strings.Contains(err.Error(), "beneath") {
		t.Errorf("..data -> ..hop -> %s named by a flag: %q %v, want refused beneath its directory", outside, b, err)
	}
}
