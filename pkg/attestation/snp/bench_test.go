package snp_test

import (
	"context"
	"testing"

	"github.com/google/go-sev-guest/verify"

	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/snp/snptest"
)

// BenchmarkCheck measures one check of a VCEK-signed report with warm collateral (the CRL
// cached): parse, certificate chain, CRL signature and freshness, report signature, policy.
// Target: at most 1 ms per check.
func BenchmarkCheck(b *testing.B) {
	for _, signer := range []string{"VCEK", "VLEK"} {
		b.Run(signer, func(b *testing.B) {
			s := newSynth(b, snp.Milan)
			r := snptest.DefaultReport()
			r.Signer = signer
			raw, certs := s.amd.Sign(b, r), s.amd.Certs(signer)
			v := s.validator(b, s.reference(), now)
			ctx := context.Background()
			if _, err := v.Check(ctx, raw, certs, nil, reportData()); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := v.Check(ctx, raw, certs, nil, reportData()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSignatureFloor measures the report's ECDSA P-384 signature check alone: the floor
// of any check on this machine.
func BenchmarkSignatureFloor(b *testing.B) {
	s := newSynth(b, snp.Milan)
	raw := s.amd.Sign(b, snptest.DefaultReport())
	for b.Loop() {
		if err := verify.SnpReportSignature(raw, s.amd.Signer.Vcek); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRSAFloor measures one RSA-4096 PSS certificate signature check (AMD's chain and
// CRLs use them).
func BenchmarkRSAFloor(b *testing.B) {
	s := newSynth(b, snp.Milan)
	for b.Loop() {
		if err := s.amd.Signer.Vcek.CheckSignatureFrom(s.amd.Signer.Ask); err != nil {
			b.Fatal(err)
		}
	}
}
