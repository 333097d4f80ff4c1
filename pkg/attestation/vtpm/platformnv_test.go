package vtpm_test

import (
	"testing"

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
