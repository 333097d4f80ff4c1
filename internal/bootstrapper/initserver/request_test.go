package initserver

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// TestParseRequestRefusesLooseReferenceSets: the init request's attestation configuration
// goes through the register rule; each loose set is refused naming the register.
func TestParseRequestRefusesLooseReferenceSets(t *testing.T) {
	for name, tc := range measurementstest.LooseSets(measurementstest.Image(variant.QEMUVTPM, nil)) {
		t.Run(name, func(t *testing.T) {
			ref, err := choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{
				Measurements: measurements.ReferenceSets{{Name: "loose", Measurements: tc.M}},
				AKRoots:      "roots are checked after the sets",
			}}.Encode()
			require.NoError(t, err)
			req := &initpb.InitRequest{
				MasterSecret: bytes.Repeat([]byte{1}, 32), MasterSalt: bytes.Repeat([]byte{2}, 32),
				MeasurementSalt: bytes.Repeat([]byte{3}, 32), ClusterName: "demo", KubernetesVersion: "v1.34.4",
				KubernetesComponents: []*joinpb.KubernetesComponent{{Name: "kubelet", Url: "file:///k", Hash: "sha256:" + strings.Repeat("ab", 32), InstallPath: "/usr/bin/kubelet"}},
				AttestationReference: ref,
			}
			_, err = parseRequest(req, "v1.34.4")
			require.Error(t, err)
			assert.ErrorContains(t, err, "attestation configuration: ")
			assert.ErrorContains(t, err, `reference set "loose": `+tc.Want)
		})
	}
}
