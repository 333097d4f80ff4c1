package snp_test

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
)

// An auditor checks an SEV-SNP report offline: AWS's real VLEK-signed report, with the
// pinned AMD roots and no network. It lists the collateral the check reads (to fetch ahead
// and Put into the cache on a machine with network); without it, it accepts an unknown
// revocation status explicitly, and the claims say so. A forged report is refused as forged
// either way.
func ExampleValidator_offline() {
	report, vlek, reportData, err := awsReport()
	if err != nil {
		fmt.Println(err)
		return
	}
	now := func() time.Time { return time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC) } // the VLEK is valid then
	ref := snp.DefaultReference("aws-sample")
	ref.Products = []string{snp.Milan}
	ref.MinimumTCB[snp.Milan] = snp.TCB{Microcode: 217}
	ref.Measurements = snp.Digests{report[0x90:0xC0]}
	ctx := context.Background()

	cache := collateral.New(collateral.Config{Now: now}) // no fetcher: offline
	v, err := snp.NewValidator(snp.Config{Reference: ref, Collateral: cache, Now: now, Revocation: attestation.RevocationUnknownAccepted})
	if err != nil {
		fmt.Println(err)
		return
	}
	urls, err := v.CollateralURLs(report, [][]byte{vlek}) // fetch these ahead and cache.Put them, or decide without
	if err != nil {
		fmt.Println(err)
		return
	}
	hw, err := v.Check(ctx, report, [][]byte{vlek}, nil, reportData)
	if err != nil {
		fmt.Println("refused:", err)
		return
	}
	fmt.Println("collateral:", urls)
	fmt.Println(hw.Product, hw.Signer, "revocation checked:", hw.RevocationChecked)

	forged := append([]byte(nil), report...)
	forged[0x90] ^= 1 // one bit of MEASUREMENT
	_, err = v.Check(ctx, forged, [][]byte{vlek}, nil, reportData)
	fmt.Println("forged:", attestation.Reason(err))
	// Output:
	// collateral: [https://kdsintf.amd.com/vlek/v1/Milan/crl]
	// Milan VLEK revocation checked: false
	// forged: bad-signature
}

// awsReport returns AWS's report, its VLEK (DER) and the REPORT_DATA it carries.
func awsReport() (report, vlek, reportData []byte, err error) {
	b64, err := os.ReadFile("testdata/aws-snp-vlek-report.b64")
	if err != nil {
		return nil, nil, nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b64)))
	if err != nil {
		return nil, nil, nil, err
	}
	vlekPEM, err := os.ReadFile("testdata/aws-snp-vlek.pem")
	if err != nil {
		return nil, nil, nil, err
	}
	block, _ := pem.Decode(vlekPEM)
	if block == nil {
		return nil, nil, nil, fmt.Errorf("no PEM in aws-snp-vlek.pem")
	}
	report = raw[:0x4A0]
	return report, block.Bytes, report[0x50:0x90], nil
}
