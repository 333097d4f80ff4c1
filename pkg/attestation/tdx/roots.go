package tdx

import (
	"crypto/sha256"
	"crypto/x509"
	_ "embed"
	"encoding/hex"
	"encoding/pem"
	"fmt"
)

// intelRootFingerprint is the SHA-256 of the DER Intel SGX Root CA (roots/README.md).
const intelRootFingerprint = "44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3"

//go:embed roots/intel-sgx-root-ca.pem
var intelRootPEM []byte

// intelRoot is the pinned root every PCK chain and every collateral signing chain must end
// in. go-tdx-guest embeds the same certificate, but we pass it explicitly (TrustedRoots), so
// what is trusted is decided here and checked against a fingerprint reviewers can see.
var intelRoot = mustParseRoot(intelRootPEM, intelRootFingerprint)

func mustParseRoot(pemBytes []byte, fingerprint string) *x509.Certificate {
	cert, err := parseRoot(pemBytes, fingerprint)
	if err != nil {
		panic(err)
	}
	return cert
}

func parseRoot(pemBytes []byte, fingerprint string) (*x509.Certificate, error) {
	block, rest := pem.Decode(pemBytes)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("pinned Intel root: no PEM certificate")
	}
	if len(rest) > 0 {
		if next, _ := pem.Decode(rest); next != nil {
			return nil, fmt.Errorf("pinned Intel root: more than one certificate")
		}
	}
	sum := sha256.Sum256(block.Bytes)
	if got := hex.EncodeToString(sum[:]); got != fingerprint {
		return nil, fmt.Errorf("pinned Intel root: SHA-256 fingerprint %s, want %s", got, fingerprint)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pinned Intel root: %w", err)
	}
	return cert, nil
}

// rootOrPinned is root, which only this package's tests set, else the pinned Intel root.
func rootOrPinned(root *x509.Certificate) *x509.Certificate {
	if root == nil {
		return intelRoot
	}
	return root
}
