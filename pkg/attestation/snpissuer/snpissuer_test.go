package snpissuer_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	sevtest "github.com/google/go-sev-guest/testing"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer/snpfake"
)

var now = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// echoBinding binds the nonce as it is, padded: enough to see that the source asks for the
// variant's report data.
func echoBinding(_, nonce []byte) ([64]byte, error) {
	var rd [64]byte
	copy(rd[:], nonce)
	return rd, nil
}

// TestLibraryFakeDevice runs the source on go-sev-guest's own fake quote provider, with a
// report that is realistic (the library's fake sets the debug bit: the policy is rewritten).
func TestLibraryFakeDevice(t *testing.T) {
	nonce := []byte("library fake device nonce 32 byt")
	rd, err := echoBinding(nil, nonce)
	require.NoError(t, err)
	raw := sevtest.CreateRawReport(&sevtest.TestReportOptions{ReportData: rd[:], FMS: 0x00a00f10, Version: 3})
	binary.LittleEndian.PutUint64(raw[0x08:0x10], snpfake.Policy)
	product := &spb.SevProduct{Name: spb.SevProduct_SEV_PRODUCT_MILAN}
	qp, err := sevtest.TcQuoteProvider([]sevtest.TestCase{{Name: "bound", Input: rd, Output: raw}},
		&sevtest.DeviceOptions{Now: now, Product: product})
	require.NoError(t, err)

	src, err := snpissuer.New(snpissuer.Config{QuoteProvider: qp, ReportData: echoBinding})
	require.NoError(t, err)
	hw, err := src.Hardware(context.Background(), nil, nonce)
	require.NoError(t, err)

	require.Len(t, hw.SnpReport, abi.ReportSize)
	report, err := abi.ReportToProto(hw.SnpReport)
	require.NoError(t, err)
	assert.Equal(t, rd[:], report.ReportData)
	policy, err := abi.ParseSnpPolicy(report.Policy)
	require.NoError(t, err)
	assert.False(t, policy.Debug)
	require.Len(t, hw.SnpCertificates, 3)
	assert.Equal(t, qp.Device.Signer.Vcek.Raw, hw.SnpCertificates[0], "VCEK first")
	assert.Equal(t, qp.Device.Signer.Ask.Raw, hw.SnpCertificates[1])
	assert.Equal(t, qp.Device.Signer.Ark.Raw, hw.SnpCertificates[2])
	assert.Empty(t, hw.Collateral, "no collateral cache configured")
}

// TestProducts issues on fake Milan, Genoa and Turin platforms with both signing keys and
// checks the evidence with go-sev-guest's verifier against the fake roots: the certificates
// come in chain order, the signing key's first, and the report verifies.
func TestProducts(t *testing.T) {
	for _, product := range []string{"Milan-B0", "Genoa-B1", "Turin-B0"} {
		for _, signer := range []abi.ReportSigner{abi.VcekReportSigner, abi.VlekReportSigner} {
			t.Run(fmt.Sprintf("%s/%s", product, signer), func(t *testing.T) {
				p, err := snpfake.New(snpfake.Options{ProductName: product, Signer: signer, Now: now, Chip: 7})
				require.NoError(t, err)
				src, err := snpissuer.New(snpissuer.Config{QuoteProvider: p.QuoteProvider(), ReportData: echoBinding})
				require.NoError(t, err)
				nonce := []byte("a nonce of thirty-two bytes.....")
				hw, err := src.Hardware(context.Background(), nil, nonce)
				require.NoError(t, err)

				require.Len(t, hw.SnpCertificates, 3)
				assert.Equal(t, p.Endorsement().Raw, hw.SnpCertificates[0])
				assert.Equal(t, p.Intermediate().Raw, hw.SnpCertificates[1])
				assert.Equal(t, p.Signer.Ark.Raw, hw.SnpCertificates[2])

				ext, err := snpissuer.Split(hw.SnpReport)
				require.NoError(t, err)
				assert.Equal(t, p.ProductLine, ext.ProductLine)
				assert.Equal(t, signer, ext.Signer)

				report, err := abi.ReportToProto(hw.SnpReport)
				require.NoError(t, err)
				chain := &spb.CertificateChain{AskCert: p.Intermediate().Raw, ArkCert: p.Signer.Ark.Raw}
				if signer == abi.VlekReportSigner {
					chain.VlekCert = hw.SnpCertificates[0]
				} else {
					chain.VcekCert = hw.SnpCertificates[0]
				}
				roots := &trust.AMDRootCerts{ProductLine: p.ProductLine, ProductCerts: &trust.ProductCerts{Ark: p.Signer.Ark, Ask: p.Signer.Ask, Asvk: p.Signer.Asvk}}
				err = verify.SnpAttestation(&spb.Attestation{Report: report, CertificateChain: chain}, &verify.Options{
					DisableCertFetching: true,
					Now:                 now,
					Product:             p.Product,
					TrustedRoots:        map[string][]*trust.AMDRootCerts{p.ProductLine: {roots}},
				})
				require.NoError(t, err)
			})
		}
	}
}

type fetcher map[string][]byte

func (f fetcher) Fetch(_ context.Context, url string) (map[string][]string, []byte, error) {
	body, ok := f[url]
	if !ok {
		return nil, nil, fmt.Errorf("404 %s", url)
	}
	return nil, body, nil
}

func TestCarriedCollateral(t *testing.T) {
	testCases := map[string]struct {
		opts     snpfake.Options
		wantURLs func(p *snpfake.Platform) []string
		wantErr  string
	}{
		"host supplies the VCEK: only the CRL is carried": {
			opts:     snpfake.Options{ProductName: "Genoa-B1"},
			wantURLs: func(p *snpfake.Platform) []string { return []string{p.CRLURL()} },
		},
		"host supplies no certificate: the VCEK is carried too": {
			opts:     snpfake.Options{ProductName: "Milan-B0", OmitCertificates: true},
			wantURLs: func(p *snpfake.Platform) []string { return []string{p.CRLURL(), p.VCEKURL()} },
		},
		"VLEK: the VLEK CRL": {
			opts:     snpfake.Options{ProductName: "Milan-B0", Signer: abi.VlekReportSigner},
			wantURLs: func(p *snpfake.Platform) []string { return []string{p.CRLURL()} },
		},
		"VLEK without certificate cannot be completed": {
			opts:    snpfake.Options{ProductName: "Milan-B0", Signer: abi.VlekReportSigner, OmitCertificates: true},
			wantErr: "no VLEK certificate",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			tc.opts.Now = now
			p, err := snpfake.New(tc.opts)
			require.NoError(t, err)
			crl, err := p.CRL(now.Add(-time.Hour), now.Add(24*time.Hour))
			require.NoError(t, err)
			cache := collateral.New(collateral.Config{
				Now:     func() time.Time { return now },
				Fetcher: fetcher{p.CRLURL(): crl, p.VCEKURL(): p.Signer.Vcek.Raw},
			})
			src, err := snpissuer.New(snpissuer.Config{QuoteProvider: p.QuoteProvider(), ReportData: echoBinding, Collateral: cache})
			require.NoError(t, err)
			hw, err := src.Hardware(context.Background(), nil, []byte("a nonce of thirty-two bytes....."))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			var urls []string
			for _, c := range hw.Collateral {
				urls = append(urls, c.Url)
				if c.Url == p.CRLURL() {
					parsed, err := x509.ParseRevocationList(c.Body)
					require.NoError(t, err)
					assert.NoError(t, parsed.CheckSignatureFrom(p.Signer.Ark))
				}
			}
			assert.Equal(t, tc.wantURLs(p), urls)
		})
	}
}

// lyingProvider answers with a report for other data than asked.
type lyingProvider struct{ p *snpfake.Platform }

func (l lyingProvider) IsSupported() bool        { return true }
func (l lyingProvider) Product() *spb.SevProduct { return l.p.Product }
func (l lyingProvider) GetRawQuote(rd [64]byte) ([]byte, error) {
	rd[0] ^= 1
	return l.p.QuoteProvider().GetRawQuote(rd)
}

type shortProvider struct{ lyingProvider }

func (shortProvider) GetRawQuote([64]byte) ([]byte, error) { return make([]byte, 100), nil }

func TestErrors(t *testing.T) {
	p, err := snpfake.New(snpfake.Options{Now: now})
	require.NoError(t, err)
	testCases := map[string]struct {
		cfg     snpissuer.Config
		wantErr string
	}{
		"device fails": {
			cfg:     snpissuer.Config{QuoteProvider: snpfake.Failing{}, ReportData: echoBinding},
			wantErr: "getting SEV-SNP extended report: input/output error",
		},
		"device answers for other data": {
			cfg:     snpissuer.Config{QuoteProvider: lyingProvider{p}, ReportData: echoBinding},
			wantErr: "report for other REPORT_DATA",
		},
		"device answers short": {
			cfg:     snpissuer.Config{QuoteProvider: shortProvider{lyingProvider{p}}, ReportData: echoBinding},
			wantErr: "shorter than a report",
		},
		"binding fails": {
			cfg: snpissuer.Config{QuoteProvider: p.QuoteProvider(), ReportData: func(_, _ []byte) ([64]byte, error) {
				return [64]byte{}, errors.New("bad AK")
			}},
			wantErr: "SEV-SNP report data: bad AK",
		},
		"collateral offline": {
			cfg:     snpissuer.Config{QuoteProvider: p.QuoteProvider(), ReportData: echoBinding, Collateral: collateral.New(collateral.Config{})},
			wantErr: "collateral not available offline",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			src, err := snpissuer.New(tc.cfg)
			require.NoError(t, err)
			_, err = src.Hardware(context.Background(), nil, []byte("a nonce of thirty-two bytes....."))
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
	_, err = snpissuer.New(snpissuer.Config{})
	assert.Error(t, err)
}

// FuzzSplit: Split parses what the guest device returns; it must never panic.
func FuzzSplit(f *testing.F) {
	p, err := snpfake.New(snpfake.Options{Now: now})
	require.NoError(f, err)
	raw, err := p.QuoteProvider().GetRawQuote([64]byte{1})
	require.NoError(f, err)
	f.Add(raw)
	f.Add(raw[:abi.ReportSize])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		ext, err := snpissuer.Split(data)
		if err == nil && len(ext.Raw) != abi.ReportSize {
			t.Fatalf("report of %d bytes", len(ext.Raw))
		}
	})
}

// TestConcurrent: one source serves concurrent evidence (run with -race).
func TestConcurrent(t *testing.T) {
	p, err := snpfake.New(snpfake.Options{Now: now})
	require.NoError(t, err)
	src, err := snpissuer.New(snpissuer.Config{QuoteProvider: p.QuoteProvider(), ReportData: echoBinding})
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := bytes.Repeat([]byte{byte(i)}, 32)
			hw, err := src.Hardware(context.Background(), nil, n)
			if err == nil && !bytes.Equal(hw.SnpReport[0x50:0x70], n) {
				err = fmt.Errorf("report %d binds other data", i)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}
