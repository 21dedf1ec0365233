package fed

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/creds"
	"github.com/xmsg/xmsg/internal/fed/fedtest"
)

// TestLoadFromCredentialsDirectory: under systemd every input comes from
// $CREDENTIALS_DIRECTORY by its LoadCredential= name (fed-cert, fed-key, peers, fed-ca), and a
// peer's "ca": "fed-ca" names the fed-ca credential.
func TestLoadFromCredentialsDirectory(t *testing.T) {
	dir := t.TempDir()
	me := fedtest.New(t, "me", nil, fedtest.Options{})
	ca := fedtest.New(t, "ca", nil, fedtest.Options{CA: true})
	member := fedtest.New(t, "m", ca, fedtest.Options{URIs: []string{"spiffe://x/node/m"}})
	for name, data := range map[string][]byte{
		CredCert: me.CertPEM, CredKey: me.KeyPEM, CredCA: ca.CertPEM,
		CredPeers: []byte(`{"cluster": {"address": "192.0.2.5:7443", "ca": "fed-ca", "identities": ["spiffe://x/node/*"], "allow": ["send"]}}`),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("CREDENTIALS_DIRECTORY", dir)
	if !Enabled(Config{}) {
		t.Fatal("a peers credential does not enable federation")
	}
	n, err := New(Config{Host: "me"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Pin() != me.Pin || n.st.Load().source != creds.SourceCredentialsDirectory {
		t.Errorf("pin %s source %s", n.Pin(), n.st.Load().source)
	}
	if p, err := n.st.Load().peers.Inbound(chainOf(member)); err != nil || p.Name != "cluster" {
		t.Errorf("CA member: %v %v", p, err)
	}
	if got := n.Ports(); len(got) != 1 || got[0] != 7443 {
		t.Errorf("Ports = %v", got)
	}
	// A credential readable by others is refused, naming it and not its content.
	os.Chmod(filepath.Join(dir, CredKey), 0o644)
	_, err = New(Config{Host: "me"})
	if err == nil || !strings.Contains(err.Error(), "fed-key") || strings.Contains(err.Error(), "PRIVATE") {
		t.Errorf("open key: %v", err)
	}
}

func TestEnabled(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", t.TempDir())
	if Enabled(Config{}) {
		t.Error("enabled without peers or listener")
	}
	if !Enabled(Config{Listen: "192.0.2.1:1"}) || !Enabled(Config{PeersPath: "/p"}) {
		t.Error("not enabled by --fed-listen or --peers-file")
	}
}

func chainOf(cs ...*fedtest.Cert) []*x509.Certificate {
	var out []*x509.Certificate
	for _, c := range cs {
		out = append(out, c.Cert)
	}
	return out
}
