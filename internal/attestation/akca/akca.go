// Package akca is a platform's attestation-key certificate authority: it certifies the AK of
// a node's TPM when the platform creates the node, so validators can trust an AK because the
// platform vouches for it rather than because the evidence says so. The local provider runs
// one per cluster; clouds have their own (for example Google's vTPM AK certificates).
package akca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/openconstellation/constellation/internal/attestation/vtpm"
)

// CA signs AK certificates. Its key is ECDSA P-256: cheap to sign with, and validators cache
// verified certificates, so the higher ECDSA verify cost is paid once per node, not per quote.
type CA struct {
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
}

// New creates a self-signed CA valid from now for validity.
func New(commonName string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{key: key, cert: cert}, nil
}

// Load restores a CA from PEM certificate and PKCS#8 key.
func Load(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("akca: certificate or key is not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("akca: certificate: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("akca: key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("akca: key is not the ECDSA key of the certificate")
	}
	return &CA{key: key, cert: cert}, nil
}

// PEM returns the CA certificate and its PKCS#8 private key.
func (ca *CA) PEM() (certPEM, keyPEM []byte, err error) {
	k, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k}), nil
}

// Certificate returns the CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Pool returns a pool holding only this CA, for validators.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// CertifyAK issues a certificate for the AK whose TPMT_PUBLIC encoding is akPublic, after
// checking that it is a TPM-resident restricted signing key. nodeName becomes the subject.
func (ca *CA) CertifyAK(akPublic []byte, nodeName string, now time.Time, validity time.Duration) ([]byte, error) {
	pub, err := tpm2.DecodePublic(akPublic)
	if err != nil {
		return nil, fmt.Errorf("akca: AK public area: %w", err)
	}
	key, err := vtpm.CheckAKAttributes(pub)
	if err != nil {
		return nil, fmt.Errorf("akca: refusing to certify: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: nodeName, OrganizationalUnit: []string{"attestation key"}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key, ca.key)
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
