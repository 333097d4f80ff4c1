// Package simcluster creates, for tests, a cluster of one control plane and one worker on a
// simulated subscription (azuresim) through the Azure provider's host half, as the CLI does:
// the state the node half's and the volumes' tests run on.
package simcluster

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Group is the cluster's resource group.
const Group = "mini-rg"

// Cluster is the created cluster: the cloud it lives in, the platform (the catalog's, on that
// cloud) and workspace that made it, and its UID.
type Cluster struct {
	Cloud     *azuresim.Cloud
	Platform  azure.Platform
	Workspace string
	UID       string
}

// New creates control-plane-0 and worker-0 in a new simulated subscription.
func New(t testing.TB, subscription string) Cluster {
	t.Helper()
	cloud := azuresim.New(subscription, azuresim.Hooks{})
	c := config.Default()
	c.Name = "mini"
	c.Provider = config.ProviderFor(azure.Name, config.ProviderBlock{ControlPlanes: 1, Workers: 1,
		Image:    "/subscriptions/" + subscription + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/constellation/versions/1.0.0",
		Settings: map[string]any{"subscriptionID": subscription, "resourceGroup": Group, "location": "westeurope"}})
	c.Attestation = config.AttestationFor(variant.AzureSEVSNP, config.VariantConfig{Measurements: measurements.ReferenceSets{{
		Name: "test", Measurements: measurementstest.Image(variant.AzureSEVSNP, map[uint32][]byte{4: make([]byte, 32)}),
	}}})
	p := azure.Platform{Credential: azuresim.Credential, Transport: cloud.Transport(), PollEvery: time.Millisecond}
	ws := t.TempDir()
	_, err := p.Create(t.Context(), provider.CreateRequest{Workspace: ws, Config: c, Nodes: []provider.NodeSpec{
		{Name: "control-plane-0", Role: metadata.ControlPlane}, {Name: "worker-0", Role: metadata.Worker},
	}})
	require.NoError(t, err)
	vm, ok := cloud.VM(Group, "worker-0")
	require.True(t, ok)
	return Cluster{Cloud: cloud, Platform: p, Workspace: ws, UID: *vm.Tags[azuremeta.TagUID]}
}
