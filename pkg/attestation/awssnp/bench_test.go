package awssnp_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer/snpfake"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// BenchmarkValidate is the cost of one full aws-sev-snp validation (TPM quote, then the
// SEV-SNP report: VLEK chain, CRL, signature, policy) with warm collateral (the CRL cached).
func BenchmarkValidate(b *testing.B) {
	tpm := boot(b, vtpmtest.Simulator(b))
	for _, product := range []string{"Milan-B1", "Genoa-B1"} {
		b.Run(product, func(b *testing.B) {
			node := newVM(b, tpm, snpfake.Options{ProductName: product, Chip: 1})
			ver := newVerifier(b, reference(node.platform.ProductLine), node.pcrs, node.platform)
			ev := node.issue(b, nonce)
			_, err := ver.v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
			require.NoError(b, err)
			b.ResetTimer()
			for b.Loop() {
				if _, err := ver.v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkIssue is the cost of one evidence on the simulator with the fake SEV-SNP device
// (quote plus PCR read plus a fake report: the real device adds a guest request to the PSP).
func BenchmarkIssue(b *testing.B) {
	tpm := boot(b, vtpmtest.Simulator(b))
	node := newVM(b, tpm, snpfake.Options{ProductName: "Milan-B1", Chip: 1})
	b.ResetTimer()
	for b.Loop() {
		node.issue(b, nonce)
	}
}
