package azuresnp

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// CertificateSource returns the certificates for this VM's SEV-SNP report: the VCEK first
// (DER), then whatever chain the platform gives (the validator trusts only its pinned roots).
type CertificateSource interface {
	Certificates(ctx context.Context) ([][]byte, error)
}

// THIMURL is Azure's Trusted Hardware Identity Management endpoint of the instance metadata
// service, which serves the VCEK of the host the VM runs on.
const THIMURL = "http://169.254.169.254/metadata/THIM/amd/certification"

// thimTimeout bounds a THIM request when the caller's context has no deadline.
const thimTimeout = 10 * time.Second

// maxTHIMResponse bounds the THIM response (a VCEK and a two-certificate chain are ~6 KiB).
const maxTHIMResponse = 64 << 10

// THIM fetches the VCEK and chain from Azure's THIM endpoint.
type THIM struct {
	// Client defaults to an http.Client without proxy (the endpoint is link-local).
	Client *http.Client
	// URL defaults to THIMURL.
	URL string
}

type thimResponse struct {
	VCEKCert         string `json:"vcekCert"`
	CertificateChain string `json:"certificateChain"`
}

// Certificates returns the VCEK followed by the chain (ASK, ARK), as DER.
func (t *THIM) Certificates(ctx context.Context) ([][]byte, error) {
	client, url := t.Client, t.URL
	if client == nil {
		client = &http.Client{Transport: &http.Transport{Proxy: nil}}
	}
	if url == "" {
		url = THIMURL
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, thimTimeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("THIM request: %w", err)
	}
	req.Header.Set("Metadata", "true")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("THIM: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTHIMResponse+1))
	if err != nil {
		return nil, fmt.Errorf("THIM: reading response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("THIM: HTTP %s", resp.Status)
	}
	if len(body) > maxTHIMResponse {
		return nil, fmt.Errorf("THIM: response larger than %d bytes", maxTHIMResponse)
	}
	var r thimResponse
	if err := strictjson.UnmarshalIgnoreUnknown(body, &r); err != nil {
		return nil, fmt.Errorf("THIM: response: %w", err)
	}
	vcek, err := pemCertificates(r.VCEKCert)
	if err != nil || len(vcek) != 1 {
		return nil, fmt.Errorf("THIM: vcekCert: want one PEM certificate (%d found): %v", len(vcek), err)
	}
	chain, err := pemCertificates(r.CertificateChain)
	if err != nil {
		return nil, fmt.Errorf("THIM: certificateChain: %w", err)
	}
	return append(vcek, chain...), nil
}

func pemCertificates(s string) ([][]byte, error) {
	var out [][]byte
	rest := []byte(s)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %q, want CERTIFICATE", block.Type)
		}
		out = append(out, block.Bytes)
	}
	return out, nil
}

// certificateTTL is how long a Source reuses the certificates: the VCEK changes only when
// the host's firmware TCB does.
const certificateTTL = time.Hour

// Source is the vtpm.HardwareSource of azure-sev-snp: the HCL report from the vTPM's NV index
// and the VCEK for it.
type Source struct {
	tpm   *vtpm.TPM
	certs CertificateSource

	mu        sync.Mutex
	cached    [][]byte
	fetchedAt time.Time
}

// NewSource returns a source reading the HCL report from tpm and the VCEK from certs (in
// production a THIM).
func NewSource(tpm *vtpm.TPM, certs CertificateSource) (*Source, error) {
	if tpm == nil || certs == nil {
		return nil, errors.New("azure-sev-snp source: TPM and certificate source are required")
	}
	return &Source{tpm: tpm, certs: certs}, nil
}

// Hardware returns the HCL report and the VCEK. It refuses an HCL report whose runtime data
// names another AK than the issuer's: every validator would refuse the evidence, and here the
// cause is plain (the issuer quotes with another key than the HCL's AK).
func (s *Source) Hardware(ctx context.Context, akPublic []byte, _ []byte) (*hardwarepb.Hardware, error) {
	raw, hcl, err := azure.ReadHCLReport(s.tpm, azure.ReportTypeSNP)
	if err != nil {
		return nil, err
	}
	if err := azure.CheckOwnAK(hcl, akPublic); err != nil {
		return nil, err
	}
	certs, err := s.certificates(ctx)
	if err != nil {
		return nil, err
	}
	return &hardwarepb.Hardware{HclReport: raw, SnpCertificates: certs}, nil
}

func (s *Source) certificates(ctx context.Context) ([][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cached != nil && time.Since(s.fetchedAt) < certificateTTL {
		return s.cached, nil
	}
	certs, err := s.certs.Certificates(ctx)
	if err != nil {
		return nil, fmt.Errorf("VCEK: %w", err)
	}
	if len(certs) == 0 {
		return nil, errors.New("VCEK: the certificate source returned none")
	}
	s.cached, s.fetchedAt = certs, time.Now()
	return certs, nil
}

// NewIssuer returns an azure-sev-snp issuer on tpm, with the VCEK from certs.
func NewIssuer(tpm *vtpm.TPM, certs CertificateSource) (*vtpm.Issuer, error) {
	src, err := NewSource(tpm, certs)
	if err != nil {
		return nil, err
	}
	// The HCL's AK, which the runtime data names (azure.AKHandle).
	return vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: Variant, Hardware: src, LoadAK: azure.LoadAK})
}
