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
//
// The report repeats here, as a boot-time report does with every evidence of a node
// (azure-sev-snp, aws-sev-snp): its signature is verified once. BenchmarkCheckFreshReport
// measures a report never seen before (gcp-sev-snp makes one per evidence).
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

// BenchmarkCheckFreshReport checks a report never checked before every iteration (the same
// fields signed anew: ECDSA signatures are randomized), with warm collateral and key memo.
func BenchmarkCheckFreshReport(b *testing.B) {
	s := newSynth(b, snp.Milan)
	certs := s.amd.Certs("VCEK")
	v := s.validator(b, s.reference(), now)
	ctx := context.Background()
	const n = 64
	reports := make([][]byte, n)
	for i := range reports {
		reports[i] = s.amd.Sign(b, snptest.DefaultReport())
	}
	if _, err := v.Check(ctx, reports[0], certs, nil, reportData()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 1
	for b.Loop() {
		if i == n {
			// Every report was seen: sign new ones outside the timer.
			b.StopTimer()
			for j := range reports {
				reports[j] = s.amd.Sign(b, snptest.DefaultReport())
			}
			i = 0
			b.StartTimer()
		}
		if _, err := v.Check(ctx, reports[i], certs, nil, reportData()); err != nil {
			b.Fatal(err)
		}
		i++
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
