package initserver

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/api/join/joinpb"
)

// TestParseRequestRefusesLooseReferenceSets: the init request's attestation configuration
// goes through the register rule; each loose set is refused naming the register.
func TestParseRequestRefusesLooseReferenceSets(t *testing.T) {
	zero := fmt.Sprintf("%q", strings.Repeat("00", 32))
	image := func(extra ...string) string {
		regs := []string{}
		for i := range 15 {
			regs = append(regs, fmt.Sprintf("%q: %s", fmt.Sprint(i), zero))
		}
		return "{" + strings.Join(append(regs, extra...), ", ") + "}"
	}
	for name, tc := range map[string]struct{ measurements, want string }{
		"only PCR 0":       {`{"0": ` + zero + `}`, "missing PCR 1, PCR 2"},
		"only PCRs 16, 23": {`{"16": ` + zero + `, "23": ` + zero + `}`, "PCR 16, PCR 23 not measured by the image"},
		"PCR 11 warn-only": {strings.Replace(image(), `"11": `+zero, `"11": {"expected": `+zero+`, "warnOnly": true}`, 1), "PCR 11 warn-only"},
		"PCR 15 pinned":    {image(`"15": ` + zero), "PCR 15 must not be in a reference set"},
	} {
		t.Run(name, func(t *testing.T) {
			req := &initpb.InitRequest{
				MasterSecret: bytes.Repeat([]byte{1}, 32), MasterSalt: bytes.Repeat([]byte{2}, 32),
				MeasurementSalt: bytes.Repeat([]byte{3}, 32), ClusterName: "demo", KubernetesVersion: "v1.34.4",
				KubernetesComponents: []*joinpb.KubernetesComponent{{Name: "kubelet", Url: "file:///k", Hash: "sha256:" + strings.Repeat("ab", 32), InstallPath: "/usr/bin/kubelet"}},
				AttestationVariant:   "qemu-vtpm",
				ReferenceSets:        []byte(`[{"name": "loose", "measurements": ` + tc.measurements + `}]`),
				AkRoots:              []byte("roots are checked after the sets"),
			}
			_, err := parseRequest(req, "v1.34.4")
			require.Error(t, err)
			assert.ErrorContains(t, err, "attestation configuration: ")
			assert.ErrorContains(t, err, `reference set "loose": `+tc.want)
		})
	}
}
