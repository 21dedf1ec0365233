package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"

	"github.com/xmsg/xmsg/internal/agy"
	"github.com/xmsg/xmsg/internal/codex"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/peercred"
)

// needsExeHelper reports whether any attestation reads another process's /proc/<pid>/exe
// or /proc/<pid>/fd, which Landlock will deny the daemon itself.
func needsExeHelper(cfg *config.Config) bool {
	return len(cfg.SvcExe) > 0 || len(cfg.CodexExe) > 0 || len(cfg.AgyExe) > 0
}

// attestationDirs are the directories harness attestation reads (Landlock read-only rules):
// the Codex homes, for their writer locks and rollout headers. A home that does not exist
// now cannot be allowed (Landlock rules hold open directories) and is reported.
func attestationDirs(cfg *config.Config, log *slog.Logger) []string {
	var out []string
	dirs := append(append([]string(nil), cfg.CodexHome...), cfg.AgyPresenceDir)
	// A Codex app-server copy is attested against the content of the trusted executables,
	// read at each attestation: the directories holding them are read-only rules too.
	for _, exe := range cfg.CodexExe {
		if c, err := peercred.Canonical(exe); err == nil {
			dirs = append(dirs, filepath.Dir(c))
		}
	}
	for _, h := range dirs {
		if h == "" {
			continue
		}
		if _, err := os.Stat(h); errors.Is(err, os.ErrNotExist) {
			log.Warn("codex home or agy presence dir missing; its sessions cannot be attested until a restart", "dir", h)
			continue
		}
		out = append(out, h)
	}
	return out
}

// codexAttester builds the Codex attester (nil when Codex is not configured). exe and files
// are the exehelper's in a sandboxed daemon; nil means this process reads /proc itself.
func codexAttester(cfg *config.Config, proc peercred.Proc, exe func(int) (string, error), files func(int) ([]peercred.OpenFile, error), sum func(int) (string, string, error)) *codex.Attester {
	if exe == nil {
		exe = proc.Exe
	}
	if files == nil {
		files = proc.OpenFiles
	}
	if sum == nil {
		var digests peercred.Digests
		sum = func(pid int) (string, string, error) { return proc.ExeDigest(pid, &digests) }
	}
	return codex.New(codex.Config{Exes: cfg.CodexExe, Homes: cfg.CodexHome, Exe: exe, Files: files, ExeDigest: sum, Locks: proc.Locks})
}

// agyAttester builds the Antigravity attester (nil when agy is not configured).
func agyAttester(cfg *config.Config, proc peercred.Proc, exe func(int) (string, error), files func(int) ([]peercred.OpenFile, error)) *agy.Attester {
	if exe == nil {
		exe = proc.Exe
	}
	if files == nil {
		files = proc.OpenFiles
	}
	return agy.New(agy.Config{Exes: cfg.AgyExe, PresenceDir: cfg.AgyPresenceDir, Exe: exe, Files: files, Locks: proc.Locks})
}

// startAgyHelper is step 4c: the agentapi helper, started before the sandbox applies
// (Landlock, inherited by children, would deny agentapi its TCP connection to the language
// server). Off Linux, agentapi runs in-process (nothing is sandboxed there).
func (d *Daemon) startAgyHelper() error {
	cfg := d.cfg
	if len(cfg.AgyExe) == 0 {
		return nil
	}
	if runtime.GOOS != "linux" {
		d.agySend = func(c agy.Credentials, title, env string) (agy.Outcome, error) {
			return agy.Send(cfg.AgyBin, c, title, env)
		}
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("agy helper: %w", err)
	}
	h, err := agy.StartHelper(self, cfg.AgyBin, os.Environ())
	if err != nil {
		return err
	}
	d.onClose(h.Close)
	d.agySend = h.Send
	return nil
}
