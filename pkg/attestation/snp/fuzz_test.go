package snp

import (
	"encoding/base64"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-sev-guest/abi"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// FuzzParseReport feeds the parse step (the only code that reads evidence before any
// signature is checked) arbitrary reports and certificates: it must never panic, and must
// either refuse with a reason or return a report of a known product line.
func FuzzParseReport(f *testing.F) {
	read := func(name string) []byte {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	azure := read("azure-snp-attestation.bin")[:abi.ReportSize]
	aws, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(read("aws-snp-vlek-report.b64"))))
	if err != nil {
		f.Fatal(err)
	}
	vcek := read("azure-snp-vcek.cert")
	vlek := read("aws-snp-vlek.pem")
	f.Add(azure, vcek)
	f.Add(aws, vlek)
	f.Add(aws, vcek)
	f.Add(azure, read("azure-snp-certchain.pem"))
	f.Add(azure[:100], []byte{})
	f.Fuzz(func(t *testing.T, report, cert []byte) {
		p, err := parseReport(report, [][]byte{cert})
		if err != nil {
			if !errors.Is(err, attestation.ErrMalformed) && !errors.Is(err, attestation.ErrUntrustedSigner) {
				t.Fatalf("error without a parse reason: %v", err)
			}
			return
		}
		if len(p.raw) != abi.ReportSize || !slices.Contains(ProductLines, p.product) {
			t.Fatalf("parsed %d bytes of product %q", len(p.raw), p.product)
		}
		if p.signer != abi.VcekReportSigner && p.signer != abi.VlekReportSigner {
			t.Fatalf("signer %v", p.signer)
		}
	})
}
