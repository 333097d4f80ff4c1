package gcpsnp_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer/snpfake"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// BenchmarkValidate is the cost of one full gcp-sev-snp validation (AK certificate, TPM
// quote, then the SEV-SNP report: VCEK chain, CRL, signature, policy) with warm collateral:
// the VCEK from the host's certificate table, or fetched once and cached.
func BenchmarkValidate(b *testing.B) {
	tpm := boot(b, vtpmtest.Simulator(b))
	for name, omit := range map[string]bool{"vcek-from-host": false, "vcek-cached": true} {
		b.Run(name, func(b *testing.B) {
			node := newVM(b, tpm, snpfake.Options{ProductName: "Milan-B0", Chip: 1, OmitCertificates: omit}, google(), nil)
			v := newValidator(b, reference("Milan"), node.pcrs, &clock{now: start}, serve(b, node.platform), node.platform)
			ev := node.issue(b, nonce)
			_, err := v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
			require.NoError(b, err)
			b.ResetTimer()
			for b.Loop() {
				if _, err := v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
