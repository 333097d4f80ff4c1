package azuretdx

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// QuoteProvider turns a TDREPORT into a TD quote. Inside an Azure TDX VM the quoting enclave
// is reached through the instance metadata service (IMDS).
type QuoteProvider interface {
	Quote(ctx context.Context, tdReport []byte) ([]byte, error)
}

// IMDSQuoteURL is the instance metadata service's TD quote endpoint.
const IMDSQuoteURL = "http://169.254.169.254/acc/tdquote"

// imdsTimeout bounds a quote request when the caller's context has no deadline.
const imdsTimeout = 10 * time.Second

// maxQuoteResponse bounds the response (a TD quote with its PCK chain is about 5 KiB,
// base64 in JSON a third more).
const maxQuoteResponse = 64 << 10

// IMDS gets TD quotes from Azure's instance metadata service.
type IMDS struct {
	// Client defaults to an http.Client without proxy (the endpoint is link-local).
	Client *http.Client
	// URL defaults to IMDSQuoteURL.
	URL string
}

// Quote posts the TDREPORT (base64url) and returns the quote.
func (m *IMDS) Quote(ctx context.Context, tdReport []byte) ([]byte, error) {
	client, url := m.Client, m.URL
	if client == nil {
		client = &http.Client{Transport: &http.Transport{Proxy: nil}}
	}
	if url == "" {
		url = IMDSQuoteURL
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, imdsTimeout)
		defer cancel()
	}
	body, err := json.Marshal(map[string]string{"report": base64.RawURLEncoding.EncodeToString(tdReport)})
	if err != nil {
		return nil, fmt.Errorf("IMDS quote request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("IMDS quote request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("IMDS quote: %w", err)
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, maxQuoteResponse+1))
	if err != nil {
		return nil, fmt.Errorf("IMDS quote: reading response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("IMDS quote: HTTP %s", resp.Status)
	}
	if len(respBody) > maxQuoteResponse {
		return nil, fmt.Errorf("IMDS quote: response larger than %d bytes", maxQuoteResponse)
	}
	var r struct {
		Quote string `json:"quote"`
	}
	if err := strictjson.UnmarshalIgnoreUnknown(respBody, &r); err != nil {
		return nil, fmt.Errorf("IMDS quote: response: %w", err)
	}
	quote, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(r.Quote, "="))
	if err != nil || len(quote) == 0 {
		return nil, fmt.Errorf("IMDS quote: response has no base64url quote: %v", err)
	}
	return quote, nil
}

// Source is the vtpm.HardwareSource of azure-tdx: the HCL report from the vTPM's NV index
// and a TD quote of its TDREPORT.
type Source struct {
	tpm    *vtpm.TPM
	quotes QuoteProvider
}

// NewSource returns a source reading the HCL report from tpm and quoting its TDREPORT with
// quotes (in production an IMDS).
func NewSource(tpm *vtpm.TPM, quotes QuoteProvider) (*Source, error) {
	if tpm == nil || quotes == nil {
		return nil, errors.New("azure-tdx source: TPM and quote provider are required")
	}
	return &Source{tpm: tpm, quotes: quotes}, nil
}

// Hardware returns the HCL report and the TD quote of its TDREPORT. It refuses an HCL report
// whose runtime data names another AK than the issuer's (azure.CheckOwnAK).
func (s *Source) Hardware(ctx context.Context, akPublic []byte, _ []byte) (*hardwarepb.Hardware, error) {
	raw, hcl, err := azure.ReadHCLReport(s.tpm, azure.ReportTypeTDX)
	if err != nil {
		return nil, err
	}
	if err := azure.CheckOwnAK(hcl, akPublic); err != nil {
		return nil, err
	}
	quote, err := s.quotes.Quote(ctx, hcl.HardwareReport)
	if err != nil {
		return nil, fmt.Errorf("TD quote: %w", err)
	}
	return &hardwarepb.Hardware{HclReport: raw, TdQuote: quote}, nil
}

// NewIssuer returns an azure-tdx issuer on tpm, quoting the TDREPORT with quotes.
func NewIssuer(tpm *vtpm.TPM, quotes QuoteProvider) (*vtpm.Issuer, error) {
	src, err := NewSource(tpm, quotes)
	if err != nil {
		return nil, err
	}
	// The HCL's AK, which the runtime data names (azure.AKHandle).
	return vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: Variant, Hardware: src, LoadAK: azure.LoadAK})
}
