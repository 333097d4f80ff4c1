package bootstraptest

import (
	"testing"

	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// NewSoftwareIssuer returns a qemu-vtpm issuer of an attacker without a TPM, showing pcrs
// (missing registers read zero): vtpmtest.SoftwareIssuer with a fresh key.
func NewSoftwareIssuer(t testing.TB, pcrs map[uint32][]byte) *vtpmtest.SoftwareIssuer {
	t.Helper()
	return vtpmtest.NewSoftwareIssuer(t, qemu.Variant, nil, pcrs)
}
