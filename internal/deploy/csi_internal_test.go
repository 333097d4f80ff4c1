package deploy

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The sidecars name their Leases from the driver's name as csi-lib-utils' leaderelection
// sanitizes it; the lease Role grants exactly those names (cmd/csi-provisioner,
// cmd/csi-attacher and cmd/csi-resizer of the pinned releases).
func TestCSILeaseNames(t *testing.T) {
	for in, want := range map[string]string{
		"volumes.constellation.openconstellation.dev": "volumes-constellation-openconstellation-dev",
		"a/b.c_d":    "a-b-c-d",
		"trailing.":  "trailing-X",
		"plain-name": "plain-name",
	} {
		assert.Equal(t, want, leaseName(in), in)
	}
	var leases []string
	for _, s := range csiSidecars() {
		leases = append(leases, s.lease)
	}
	assert.Equal(t, []string{
		"volumes-constellation-openconstellation-dev",
		"external-attacher-leader-volumes-constellation-openconstellation-dev",
		"external-resizer-volumes-constellation-openconstellation-dev",
	}, leases)
	role := csiLeaseRole()
	assert.Equal(t, []string{"create"}, role.Rules[0].Verbs)
	assert.Empty(t, role.Rules[0].ResourceNames, "RBAC cannot restrict create by name")
	assert.Equal(t, leases, role.Rules[1].ResourceNames)
	assert.Equal(t, []string{"get", "update"}, role.Rules[1].Verbs)
}
