package vtpm_test

import (
	"io"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// TestPlatformNVCannotBeRewrittenByTheNode attacks the AK root a node trusts from the node's
// own software: once firmware (the provider) wrote it and disabled the platform hierarchy,
// every write through the vtpm API fails and the root stays as it was; an index the node
// defines itself, or one read while the platform hierarchy is still enabled, is refused.
func TestPlatformNVCannotBeRewrittenByTheNode(t *testing.T) {
	backends(t, func(t *testing.T, tpm *vtpm.TPM) {
		root := []byte("the platform's AK CA certificate")
		evil := []byte("an attacker's AK CA certificate")

		// Before the provider locks the platform hierarchy, the node refuses the index:
		// software on the node could still have written it.
		require.NoError(t, tpm.WritePlatformNV(vtpm.AKRootsNVIndex, root))
		_, err := tpm.ReadPlatformNV(vtpm.AKRootsNVIndex)
		assert.ErrorIs(t, err, vtpm.ErrUntrustedNV)
		assert.ErrorContains(t, err, "platform hierarchy is enabled")
		require.NoError(t, tpm.WritePlatformNV(vtpm.AKRootsNVIndex, root), "same value again: kept")

		require.NoError(t, tpm.DisablePlatformHierarchy())
		got, err := tpm.ReadPlatformNV(vtpm.AKRootsNVIndex)
		require.NoError(t, err)
		assert.Equal(t, root, got)

		// The node's software tries every write the vtpm API offers.
		assert.Error(t, tpm.WriteNV(vtpm.AKRootsNVIndex, evil), "owner-authorized replace")
		assert.Error(t, tpm.WritePlatformNV(vtpm.AKRootsNVIndex, evil), "platform-authorized replace")
		got, err = tpm.ReadPlatformNV(vtpm.AKRootsNVIndex)
		require.NoError(t, err)
		assert.Equal(t, root, got, "the root is unchanged")
	})
}

// TestPlatformNVRefusesNodeDefinedIndex: on a platform that provisioned no root, software on
// the node plants its own at the index; the node does not take it.
func TestPlatformNVRefusesNodeDefinedIndex(t *testing.T) {
	backends(t, func(t *testing.T, tpm *vtpm.TPM) {
		require.NoError(t, tpm.WriteNV(vtpm.AKRootsNVIndex, []byte("planted by the node")))
		require.NoError(t, tpm.DisablePlatformHierarchy())
		_, err := tpm.ReadPlatformNV(vtpm.AKRootsNVIndex)
		assert.ErrorIs(t, err, vtpm.ErrUntrustedNV)

		_, err = tpm.ReadPlatformNV(vtpm.AKRootsNVIndex + 1)
		assert.ErrorIs(t, err, vtpm.ErrNVNotDefined)
	})
}

// TestPlatformNVUnderFirmwareAuth: firmware that keeps the platform hierarchy enabled but sets
// its authorization to a value only it knew (OVMF) locks the AK root as well as disabling the
// hierarchy does: the node reads the root, its software cannot rewrite it, and disabling the
// hierarchy is nothing to do.
func TestPlatformNVUnderFirmwareAuth(t *testing.T) {
	backends(t, func(t *testing.T, tpm *vtpm.TPM) {
		root := []byte("the platform's AK CA certificate")
		require.NoError(t, tpm.WritePlatformNV(vtpm.AKRootsNVIndex, root))
		// The firmware's last step: a random platform authorization, then forgotten.
		require.NoError(t, tpm.With(func(rw io.ReadWriter) error {
			return tpm2.HierarchyChangeAuth(rw, tpm2.HandlePlatform,
				tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession, Auth: tpm2.EmptyAuth},
				"a random value the firmware forgot")
		}))

		got, err := tpm.ReadPlatformNV(vtpm.AKRootsNVIndex)
		require.NoError(t, err)
		assert.Equal(t, root, got)
		assert.Error(t, tpm.WritePlatformNV(vtpm.AKRootsNVIndex, []byte("an attacker's root")), "platform-authorized replace")
		assert.Error(t, tpm.WriteNV(vtpm.AKRootsNVIndex, []byte("an attacker's root")), "owner-authorized replace")
		require.NoError(t, tpm.DisablePlatformHierarchy(), "locked already: nothing to do")
		got, err = tpm.ReadPlatformNV(vtpm.AKRootsNVIndex)
		require.NoError(t, err)
		assert.Equal(t, root, got, "the root is unchanged")
	})
}
