package qemu_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// BenchmarkIssue is the cost of one evidence (one TPM quote plus PCR read) per TPM backend.
func BenchmarkIssue(b *testing.B) {
	for name, open := range map[string]func(testing.TB) *vtpm.TPM{
		"simulator": vtpmtest.Simulator,
		"swtpm":     func(t testing.TB) *vtpm.TPM { tpm, _ := vtpmtest.Swtpm(t); return tpm },
	} {
		b.Run(name, func(b *testing.B) {
			iss, err := qemu.NewIssuer(open(b), nil, nil)
			require.NoError(b, err)
			b.ResetTimer()
			for b.Loop() {
				if _, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkValidate is the cost of validating one evidence: without AK roots, and with AK
// roots (certificate chain verified once, then cached).
func BenchmarkValidate(b *testing.B) {
	tpm := vtpmtest.Simulator(b)
	ref, log := bootNode(b, tpm)
	ca, err := vtpmtest.NewPlatformCA("bench")
	require.NoError(b, err)
	iss, err := qemu.NewIssuer(tpm, nil, log)
	require.NoError(b, err)
	cert, err := ca.CertifyNodeAK(iss.AKPublic(), "node", attestation.RoleWorker, time.Now(), time.Hour)
	require.NoError(b, err)
	iss, err = qemu.NewIssuer(tpm, cert, log)
	require.NoError(b, err)
	ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(b, err)
	sets := measurements.ReferenceSets{{Name: "old", Measurements: measurementstest.Image(qemu.Variant, nil)}, {Name: "current", Measurements: ref}}

	for name, roots := range map[string]bool{"no-ak-roots": false, "ak-roots-cached": true} {
		b.Run(name, func(b *testing.B) {
			// No warning log: it would land inside the benchmark's result line.
			cfg := qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets, Log: slog.New(slog.DiscardHandler)}, AcceptUnauthenticatedAK: true}
			if roots {
				cfg.AKRoots, cfg.AcceptUnauthenticatedAK = ca.Pool(), false
			}
			val, err := qemu.NewValidator(cfg)
			require.NoError(b, err)
			b.ResetTimer()
			for b.Loop() {
				if _, err := val.Validate(context.Background(), ev, attestation.PurposeVerify, nonce); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
