// Package akca is a platform's attestation-key certificate authority: it certifies the AK of
// a node's TPM when the platform creates the node, so validators can trust an AK because the
// platform vouches for it rather than because the evidence says so. The local provider runs
// one per cluster; clouds have their own (for example Google's vTPM AK certificates).
package akca

import (
	"crypto/x509"
	"fmt"
	"time"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// CA signs AK certificates. Its key is ECDSA P-256: cheap to sign with, and validators cache
// verified certificates, so the higher ECDSA verify cost is paid once per node, not per quote.
type CA struct {
	ca *pki.CA
}

// New creates a self-signed CA valid from now for validity.
func New(commonName string, now time.Time, validity time.Duration) (*CA, error) {
	ca, err := pki.NewCA(commonName, now, validity)
	if err != nil {
		return nil, fmt.Errorf("akca: %w", err)
	}
	return &CA{ca: ca}, nil
}

// Load restores a CA from PEM certificate and key.
func Load(certPEM, keyPEM []byte) (*CA, error) {
	ca, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("akca: %w", err)
	}
	return &CA{ca: ca}, nil
}

// PEM returns the CA certificate and its PKCS#8 private key.
func (ca *CA) PEM() (certPEM, keyPEM []byte, err error) {
	keyPEM, err = pki.EncodeKey(ca.ca.Key)
	if err != nil {
		return nil, nil, err
	}
	return pki.EncodeCert(ca.ca.Cert), keyPEM, nil
}

// Certificate returns the CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.ca.Cert }

// Pool returns a pool holding only this CA, for validators.
func (ca *CA) Pool() *x509.CertPool { return ca.ca.Pool() }

// CertifyAK issues a certificate for the AK whose TPMT_PUBLIC encoding is akPublic, after
// checking that it is a TPM-resident restricted signing key. The subject names the node and
// its role (vtpm.AKCertSubject): validators bind a peer's identity and role to its key.
func (ca *CA) CertifyAK(akPublic []byte, nodeName string, role metadata.Role, now time.Time, validity time.Duration) ([]byte, error) {
	tmpl, key, err := vtpm.AKCertTemplate(akPublic, nodeName, role, now, validity)
	if err != nil {
		return nil, fmt.Errorf("akca: %w", err)
	}
	cert, err := ca.ca.Sign(tmpl, key)
	if err != nil {
		return nil, fmt.Errorf("akca: %w", err)
	}
	return cert.Raw, nil
}
