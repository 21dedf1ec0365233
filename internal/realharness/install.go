package realharness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/ostest"
)

// Package is a harness pinned to one version on the npm registry.
type Package struct {
	Name    string // e.g. "@anthropic-ai/claude-code"
	Version string
	Bin     string // the executable beneath node_modules/.bin
}

// The harness versions the tests run (docs/operations.md lists them).
var (
	ClaudeCode = Package{Name: "@anthropic-ai/claude-code", Version: "2.1.328", Bin: "claude"}
	Codex      = Package{Name: "@openai/codex", Version: "0.169.0", Bin: "codex"}
	Pi         = Package{Name: "@mariozechner/pi-coding-agent", Version: "0.73.1", Bin: "pi"}
)

// systemCache is the cache root uses, which others may read.
const systemCache = "/var/cache/xmsg-harness"

// CacheDir is where installed harnesses are kept between runs: $XMSG_HARNESS_CACHE, else
// $XDG_CACHE_HOME/xmsg-harness, else /var/cache/xmsg-harness for root, else
// ~/.cache/xmsg-harness.
func CacheDir() string {
	if d := os.Getenv("XMSG_HARNESS_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "xmsg-harness")
	}
	if os.Geteuid() == 0 {
		return systemCache
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "xmsg-harness")
}

// Install returns the prefix directory holding p, installed from the npm registry into the
// cache the first time (npm's own cache makes a reinstall cheap). Without npm, or when the
// registry cannot be reached, the test is skipped with the cause, or failed under CI=true.
func Install(t testing.TB, p Package) string {
	t.Helper()
	npm, err := exec.LookPath("npm")
	ostest.Need(t, err == nil, "npm on PATH (to install "+p.Name+")")
	name := strings.NewReplacer("@", "", "/", "-").Replace(p.Name) + "-" + p.Version
	// A user who is not root may run what root installed in the system cache (read-only).
	for _, base := range []string{CacheDir(), systemCache} {
		if _, err := os.Stat(filepath.Join(base, name, ".installed")); err == nil {
			return filepath.Join(base, name)
		}
	}
	dir := filepath.Join(CacheDir(), name)
	marker := filepath.Join(dir, ".installed")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		ostest.Need(t, false, "a writable harness cache at "+dir+": "+err.Error())
	}
	// One installer at a time per package (parallel test binaries share the cache).
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	syscall.Flock(int(lock.Fd()), syscall.LOCK_EX)
	if _, err := os.Stat(marker); err == nil {
		return dir
	}
	start := time.Now()
	cmd := exec.Command(npm, "install", "--prefix", dir, "--no-audit", "--no-fund", "--no-save", "--loglevel=error", p.Name+"@"+p.Version)
	out, err := cmd.CombinedOutput()
	if err != nil {
		last := strings.TrimSpace(string(out))
		if i := strings.LastIndex(last, "\n"); len(last) > 400 && i >= 0 {
			last = last[len(last)-400:]
		}
		ostest.Need(t, false, fmt.Sprintf("the npm registry (npm install %s@%s: %v: %s)", p.Name, p.Version, err, last))
	}
	if err := os.WriteFile(marker, []byte(p.Version+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("installed %s@%s into %s in %s", p.Name, p.Version, dir, time.Since(start).Round(time.Second))
	return dir
}

// BinPath is the executable of p installed in dir.
func BinPath(dir string, p Package) string { return filepath.Join(dir, "node_modules", ".bin", p.Bin) }

// CodexNative is the native Codex binary the npm package runs (its codex.js only starts it):
// what `--codex-exe` names.
func CodexNative(dir string) string {
	arch := map[string]string{"amd64": "x86_64-unknown-linux-musl", "arm64": "aarch64-unknown-linux-musl"}[runtime.GOARCH]
	pkg := map[string]string{"amd64": "codex-linux-x64", "arm64": "codex-linux-arm64"}[runtime.GOARCH]
	return filepath.Join(dir, "node_modules", "@openai", pkg, "vendor", arch, "bin", "codex")
}

// HomeDir returns a new directory for a harness's home, removed when the test ends. It lies
// beneath the cache, not the system's temporary directory: Codex refuses to manage its
// packages (its app-server daemon's copy) under /tmp.
func HomeDir(t testing.TB) string {
	t.Helper()
	base := filepath.Join(CacheDir(), "homes")
	if tmp := os.TempDir(); base == tmp || strings.HasPrefix(base, tmp+"/") {
		base = fmt.Sprintf("/var/tmp/xmsg-harness-homes-%d", os.Geteuid())
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := os.MkdirTemp(base, "h")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
