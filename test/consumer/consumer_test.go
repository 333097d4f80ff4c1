// Package relyingparty_test is what a third party writes against the public verifier: it
// imports only github.com/openconstellation/constellation/pkg, as published.
package relyingparty_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// TestOwnBinding: evidence of a TPM, bound to report data of the relying party's own
// scheme, verifies with the reference values and an explicit opt-in for an unauthenticated
// AK; other report data is a nonce mismatch.
func TestOwnBinding(t *testing.T) {
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	tpm := vtpm.New(sim, "simulator")
	t.Cleanup(func() { _ = tpm.Close() })
	image, log, err := vtpmtest.BootImage(tpm, variant.QEMUVTPM, "v1")
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := qemu.NewIssuer(tpm, nil, func() ([]byte, error) { return log, nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = issuer.Close() })
	nonce := sha256.Sum256([]byte("relying party session 1"))
	evidence, err := issuer.Issue(context.Background(), attestation.PurposeVerify, nonce[:])
	if err != nil {
		t.Fatal(err)
	}
	reportData, err := attestation.ReportData(attestation.PurposeVerify, nonce[:])
	if err != nil {
		t.Fatal(err)
	}

	validator, err := choose.NewValidator(choose.Reference{
		Variant: variant.QEMUVTPM,
		Values: choose.Values{
			Measurements:   measurements.ReferenceSets{{Name: "image", Measurements: image}},
			HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: true},
		},
	}, choose.Options{Collateral: collateral.New(collateral.Config{})})
	if err != nil {
		t.Fatal(err)
	}
	verified, err := attestation.ValidateReportData(context.Background(), validator, evidence, reportData)
	if err != nil {
		t.Fatal(err)
	}
	if verified.ReferenceSet != "image" {
		t.Fatalf("reference set %q", verified.ReferenceSet)
	}
	if _, err := attestation.ValidateReportData(context.Background(), validator, evidence, nonce[:]); attestation.Reason(err) != "nonce-mismatch" {
		t.Fatalf("other report data: %v", err)
	}
	if urls, err := attestation.CollateralURLs(validator, evidence); err != nil || len(urls) != 0 {
		t.Fatalf("a TPM-only variant reads no collateral: %v %v", urls, err)
	}
}

// TestRealSEVSNPReportOffline: AWS's real VLEK-signed report from the module's own test data
// verifies offline with the pinned AMD roots when an unknown revocation status is accepted,
// and names the CRL it would need.
func TestRealSEVSNPReportOffline(t *testing.T) {
	dir := moduleDir(t)
	report := readReport(t, filepath.Join(dir, "attestation/awssnp/testdata/aws-snp-vlek-report.b64"))
	vlek, err := os.ReadFile(filepath.Join(dir, "attestation/awssnp/testdata/aws-snp-vlek.pem"))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	ref := snp.DefaultReference("aws")
	ref.Products = []string{snp.Milan}
	ref.MinimumTCB[snp.Milan] = snp.TCB{Microcode: 217}
	ref.Measurements = snp.Digests{report[0x90:0xC0]} // its own MEASUREMENT
	for _, policy := range []attestation.RevocationPolicy{attestation.RevocationRequired, attestation.RevocationUnknownAccepted} {
		v, err := snp.NewValidator(snp.Config{Reference: ref, Collateral: collateral.New(collateral.Config{Now: func() time.Time { return at }}), Now: func() time.Time { return at }, Revocation: policy})
		if err != nil {
			t.Fatal(err)
		}
		urls, err := v.CollateralURLs(report, [][]byte{vlek})
		if err != nil || len(urls) != 1 || !strings.HasSuffix(urls[0], "/vlek/v1/Milan/crl") {
			t.Fatalf("collateral: %v %v", urls, err)
		}
		data := make([]byte, 64)
		copy(data, report[0x50:0x90]) // its own REPORT_DATA: the binding is not what this test checks
		hw, err := v.Check(context.Background(), report, [][]byte{vlek}, nil, data)
		switch policy {
		case attestation.RevocationRequired:
			if attestation.Reason(err) != "revocation-unknown" {
				t.Fatalf("required: %v", err)
			}
		default:
			if err != nil || hw.Signer != "VLEK" || hw.RevocationChecked {
				t.Fatalf("unknown accepted: %+v %v", hw, err)
			}
		}
	}
}

func moduleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/openconstellation/constellation/pkg").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// readReport reads a base64 report as AWS returns it (the report, then padding).
func readReport(t *testing.T, path string) []byte {
	t.Helper()
	b64, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b64)))
	if err != nil {
		t.Fatal(err)
	}
	const reportSize = 0x4A0 // an SEV-SNP attestation report
	return raw[:reportSize]
}
