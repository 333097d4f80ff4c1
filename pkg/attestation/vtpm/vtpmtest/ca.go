package vtpmtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// CA is a certificate authority standing in for a cloud's AK CA (Azure's vTPM root, Google's
// EK/AK CA) in tests: a root, or an intermediate issued by another CA.
type CA struct {
	Cert *x509.Certificate
	key  crypto.Signer
}

// NewCA returns a CA named name, self-signed when parent is nil, else issued by parent. It is
// valid from 2020 to 2050, so tests can pin any time in between.
func NewCA(t testing.TB, name string, parent *CA) *CA {
	t.Helper()
	ca, err := newCA(name, parent)
	require.NoError(t, err)
	return ca
}

// NewPlatformCA returns a self-signed CA like NewCA's, for a platform that certifies its
// nodes' AKs (CertifyNodeAK); it needs no testing.TB, so examples can use it.
func NewPlatformCA(name string) (*CA, error) { return newCA(name, nil) }

func newCA(name string, parent *CA) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2050, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	issuer, signer := tmpl, crypto.Signer(key)
	if parent != nil {
		issuer, signer = parent.Cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, key.Public(), signer)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key}, nil
}

// PEM returns the CA certificate in PEM, as a configuration's AK roots take it.
func (c *CA) PEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Cert.Raw}))
}

// CertifyNodeAK certifies the AK whose TPMT_PUBLIC encoding is akPublic the way a platform
// certifies a node's AK (vtpm.AKCertTemplate, as the local provider's AK CA does).
func (c *CA) CertifyNodeAK(akPublic []byte, nodeName string, role attestation.Role, now time.Time, validity time.Duration) ([]byte, error) {
	tmpl, key, err := vtpm.AKCertTemplate(akPublic, nodeName, role, now, validity)
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	return x509.CreateCertificate(rand.Reader, tmpl, c.Cert, key, c.key)
}

// Pool returns a pool holding only this CA.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.Cert)
	return p
}

// CertifyAK returns a DER certificate for the attestation key pub, as a cloud issues it.
func (c *CA) CertifyAK(t testing.TB, pub crypto.PublicKey, name string) []byte {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:     time.Date(2049, 1, 1, 0, 0, 0, 0, time.UTC),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, pub, c.key)
	require.NoError(t, err)
	return der
}
