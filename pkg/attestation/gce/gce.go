// Package gce holds what Google Compute Engine's vTPM variants (gcp-sev-snp, gcp-sev-es) share:
// Google's pinned EK/AK certificate authorities (CERTIFICATES.md says where each comes from)
// and where GCE provisions the attestation key they certify.
package gce

import (
	"crypto/x509"
	"embed"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"

	"github.com/google/go-tpm-tools/client"
)

// AKCertNVIndex is where GCE stores the certificate of its RSA AK, whose template is at
// client.GceAKTemplateNVIndexRSA.
const AKCertNVIndex = uint32(client.GceAKCertNVIndexRSA)

// LoadAK loads GCE's RSA AK, the key of the template GCE stores in the vTPM (for
// vtpm.IssuerConfig.LoadAK). It fails on a vTPM without that template rather than use
// another key, which Google never certified.
func LoadAK(rw io.ReadWriter) (*client.Key, error) { return client.GceAttestationKeyRSA(rw) }

//go:embed *.pem
var certFiles embed.FS

// Roots returns Google's pinned EK/AK root CAs.
func Roots() []*x509.Certificate { return load("tpm_ek_root_1.pem", "gcp_ek_ak_ca_root.pem") }

// Intermediates returns Google's EK/AK intermediate CAs.
func Intermediates() []*x509.Certificate {
	return load("tpm_ek_intermediate_2.pem", "tpm_ek_intermediate_3.pem", "gcp_ek_ak_ca_intermediate_v3.pem")
}

// RootPool returns Roots as a pool.
func RootPool() *x509.CertPool { return pool(Roots()) }

// IntermediatePool returns Intermediates, and extra, as a pool.
func IntermediatePool(extra ...*x509.Certificate) *x509.CertPool {
	return pool(append(Intermediates(), extra...))
}

func pool(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

func load(names ...string) []*x509.Certificate {
	out := make([]*x509.Certificate, 0, len(names))
	for _, n := range names {
		b, err := fs.ReadFile(certFiles, n)
		if err != nil {
			panic(err)
		}
		block, _ := pem.Decode(b)
		if block == nil {
			panic("pinned Google certificate " + n + " is not PEM")
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			panic(fmt.Sprintf("pinned Google certificate %s: %v", n, err))
		}
		out = append(out, cert)
	}
	return out
}
