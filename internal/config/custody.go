package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/xmsg/xmsg/internal/custody"
)

// custodyOptions are the credential custody flags (docs/security.md §11): which services may
// receive each secret, and the plain-file fallback for a secret systemd does not deliver as
// $CREDENTIALS_DIRECTORY/custody-<name>.
var custodyOptions = []option{
	{name: "custody", env: "XMSG_CUSTODY", doc: "none", usage: "secret NAME=svc:A,svc:B: the services that may receive it (repeatable; ';' lists)", list: true},
	{name: "custody-file", env: "XMSG_CUSTODY_FILE", doc: "none", usage: "secret NAME=PATH read when $CREDENTIALS_DIRECTORY has no custody-NAME (repeatable, ',' lists)", list: true},
	{name: "custody-reload-interval-secs", env: "XMSG_CUSTODY_RELOAD_INTERVAL_SECS", def: "30", usage: "re-read custody secrets every N seconds (0 disables; SIGHUP always re-reads)",
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("config: --custody-reload-interval-secs: %q is not an integer >= 0", v)
			}
			c.CustodyReloadInterval = time.Duration(n) * time.Second
			return nil
		}},
}

// custodySecrets reads --custody and --custody-file into c.Custody, sorted by name. Only
// svc:<name> principals are accepted: custody hands secrets to executable-attested services
// and to nothing else, so a claude:, fed: or bare principal is a configuration error, not a
// rule that silently never matches.
func custodySecrets(c *Config, given map[string][]string, getenv func(string) string) error {
	allow := given["custody"]
	if len(allow) == 0 && getenv("XMSG_CUSTODY") != "" {
		allow = []string{getenv("XMSG_CUSTODY")}
	}
	files := given["custody-file"]
	if len(files) == 0 && getenv("XMSG_CUSTODY_FILE") != "" {
		files = []string{getenv("XMSG_CUSTODY_FILE")}
	}
	byName := map[string]*custody.Secret{}
	for _, v := range allow {
		for _, item := range strings.Split(v, ";") {
			if item = strings.TrimSpace(item); item == "" {
				continue
			}
			name, list, ok := strings.Cut(item, "=")
			name = strings.TrimSpace(name)
			if !ok || !custody.ValidName(name) {
				return fmt.Errorf("config: --custody %q: want NAME=svc:A[,svc:B...] (NAME of letters, digits, '.', '_', '-')", item)
			}
			if byName[name] != nil {
				return fmt.Errorf("config: --custody: secret %s given twice", name)
			}
			s := &custody.Secret{Name: name}
			for _, p := range strings.Split(list, ",") {
				p = strings.TrimSpace(p)
				svc, isSvc := strings.CutPrefix(p, "svc:")
				if !isSvc || strings.TrimSpace(svc) == "" || strings.ContainsAny(svc, " \t") {
					return fmt.Errorf("config: --custody %s: principal %q refused: only svc:<name> principals may receive a secret", name, p)
				}
				if _, ok := c.SvcExe[svc]; !ok && !c.Leaf {
					// Custody attests the receiver by its executable: without one, the
					// policy could never be met, and a typo should fail the start.
					return fmt.Errorf("config: --custody %s: svc:%s has no --svc-exe (custody hands secrets only to executable-attested services)", name, svc)
				}
				s.Allow = append(s.Allow, svc)
			}
			byName[name] = s
		}
	}
	for _, v := range files {
		for _, item := range strings.Split(v, ",") {
			if item = strings.TrimSpace(item); item == "" {
				continue
			}
			name, path, ok := strings.Cut(item, "=")
			name, path = strings.TrimSpace(name), filepath.Clean(expand(strings.TrimSpace(path), getenv))
			if !ok || !filepath.IsAbs(path) {
				return fmt.Errorf("config: --custody-file %q: want NAME=/absolute/path", item)
			}
			s := byName[name]
			if s == nil {
				return fmt.Errorf("config: --custody-file %s: no --custody %s=svc:... names who may receive it", name, name)
			}
			if s.File != "" {
				return fmt.Errorf("config: --custody-file: secret %s given twice", name)
			}
			s.File = path
		}
	}
	for _, s := range byName {
		c.Custody = append(c.Custody, *s)
	}
	sort.Slice(c.Custody, func(i, j int) bool { return c.Custody[i].Name < c.Custody[j].Name })
	if c.Leaf && len(c.Custody) > 0 {
		return errors.New("config: --leaf forbids --custody (a leaf admits its service on uid alone; custody needs executable attestation)")
	}
	return nil
}

// CustodyFiles are the plain files of custody secrets (the sandbox keeps their directories
// readable for reload).
func (c *Config) CustodyFiles() []string {
	var out []string
	for _, s := range c.Custody {
		if s.File != "" {
			out = append(out, s.File)
		}
	}
	return out
}
