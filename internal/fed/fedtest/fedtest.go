// Package fedtest makes certificates for federation tests: self-signed Ed25519 node
// certificates (pinned peers) and a CA issuing leaf certificates with URI SANs (CA peers),
// generated with crypto/x509 at test time.
package fedtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"
)

// Cert is a certificate with its key, PEM-encoded, and its SPKI pin.
type Cert struct {
	CertPEM, KeyPEM []byte
	Pin             string // "sha256:<hex>"
	Cert            *x509.Certificate
	Key             ed25519.PrivateKey
}

// Options shape a certificate.
type Options struct {
	URIs []string // URI SANs
	IPs  []net.IP
	CA   bool
}

// New returns a certificate for name, self-signed, or signed by parent when it is non-nil.
func New(t testing.TB, name string, parent *Cert, o Options) *Cert {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		IPAddresses:  o.IPs,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, u := range o.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	if o.CA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		tmpl.ExtKeyUsage = nil
	}
	signer, issuer := key, tmpl
	if parent != nil {
		signer, issuer = parent.Key, parent.Cert
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, pub, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return &Cert{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
		Pin:     "sha256:" + hex.EncodeToString(sum[:]),
		Cert:    c,
		Key:     key,
	}
}
