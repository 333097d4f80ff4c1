package gcpsnp_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/gcpsnp"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer/snpfake"
)

// FuzzHardwareCheck feeds arbitrary reports and certificates to the gcp-sev-snp hardware
// check, seeded with a genuine one: it must never panic, accept only what is bound to the
// nonce and AK, and name one attestation reason for every refusal.
func FuzzHardwareCheck(f *testing.F) {
	p, err := snpfake.New(snpfake.Options{ProductName: "Milan-B0", Chip: 1, Now: start, Measurement: measurement})
	require.NoError(f, err)
	akPublic := []byte("TPMT_PUBLIC of the fuzzed AK")
	quoteNonce := bytes.Repeat([]byte{3}, attestation.ReportDataSize)
	rd, err := gcpsnp.ReportData(quoteNonce, akPublic)
	require.NoError(f, err)
	report, err := p.Report(rd)
	require.NoError(f, err)
	f.Add(report, p.Signer.Vcek.Raw)
	f.Add(report[:100], []byte{})
	roots, err := snp.NewRoots(p.Roots())
	require.NoError(f, err)
	c := &clock{now: start}
	check, err := gcpsnp.NewHardwareCheck(gcpsnp.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{Now: c.Now},
		Hardware:        reference("Milan"),
		Collateral:      collateral.New(collateral.Config{Fetcher: serve(f, p), Now: c.Now}),
		SNPRoots:        roots,
	})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, report, cert []byte) {
		hw := &hardwarepb.Hardware{SnpReport: report, SnpCertificates: [][]byte{cert}}
		got, err := check.Check(context.Background(), hw, nil, akPublic, quoteNonce)
		if err != nil {
			if attestation.Reason(err) == "other" {
				t.Fatalf("refusal without a reason: %v", err)
			}
			return
		}
		if got == nil || !bytes.Equal(report[0x50:0x90], rd[:]) {
			t.Fatal("accepted a report not bound to the nonce and AK")
		}
	})
}
