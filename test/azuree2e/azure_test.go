//go:build azuree2e

package azuree2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resources/armresources/v3"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// env are the test's settings, from the environment.
type env struct {
	subscription, location, image string
	// group is unique per run: the test creates it and removes it with the cluster.
	group string
}

func readEnv(t *testing.T) env {
	e := env{subscription: os.Getenv("AZURE_SUBSCRIPTION_ID"), location: os.Getenv("AZURE_LOCATION"), image: os.Getenv("CONSTELLATION_VM_IMAGE")}
	if e.subscription == "" || e.location == "" || e.image == "" {
		t.Skip("the live Azure test needs AZURE_SUBSCRIPTION_ID, AZURE_LOCATION and CONSTELLATION_VM_IMAGE (make vm-image's folder), " +
			"and credentials for azidentity.DefaultAzureCredential (az login): docs/azure.md \"Live test\"")
	}
	e.group = "constellation-e2e-" + uuid.NewString()[:8]
	return e
}

func TestAzure(t *testing.T) {
	e := readEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 55*time.Minute)
	defer cancel()
	ctx = provider.WithProgress(ctx, testWriter{t})
	p := azure.Platform{}
	config.RegisterProvider(azure.Name, p.ConfigRules())

	image, err := p.UploadImage(ctx, provider.ImageUploadRequest{Image: e.image, Version: "0.0." + time.Now().UTC().Format("20060102150405")[8:],
		Settings: map[string]string{"subscriptionID": e.subscription, "resourceGroup": e.group, "location": e.location}})
	require.NoError(t, err)
	t.Logf("image version %s", image)

	ws := t.TempDir()
	conf := config.Default()
	conf.Name = "e2e"
	conf.Provider = config.ProviderFor(azure.Name, config.ProviderBlock{ControlPlanes: 1, Image: image, Settings: map[string]any{
		"subscriptionID": e.subscription, "resourceGroup": e.group, "location": e.location,
	}})
	conf.Attestation = config.AttestationFor(variant.AzureSEVSNP, config.VariantConfig{Measurements: measurements.ReferenceSets{{
		Name: "unused", Measurements: measurementstest.Image(variant.AzureSEVSNP, nil),
	}}})
	t.Cleanup(func() {
		// Removal runs whatever failed: the cluster, then the group with the image.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		n, err := p.Remove(provider.WithProgress(ctx, testWriter{t}), ws)
		assert.NoError(t, err, "removing the cluster")
		t.Logf("removed %d nodes; deleting the test's resource group %s (the image)", n, e.group)
		assert.NoError(t, deleteGroup(ctx, e), "delete it by hand: az group delete -n %s", e.group)
	})

	prov, err := p.Create(ctx, provider.CreateRequest{Workspace: ws, Config: conf, Nodes: []provider.NodeSpec{{Name: "control-plane-0", Role: metadata.ControlPlane}}})
	require.NoError(t, err)
	nodes, err := prov.Nodes(ctx)
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	assert.Equal(t, provider.Running, nodes[0].State)
	ep, err := prov.Endpoints(ctx)
	require.NoError(t, err)
	t.Logf("API endpoint %s", ep.APIServer)

	// What Azure made of the request: a confidential VM with a vTPM, as asked.
	cred, err := azidentity.NewDefaultAzureCredential(nil)
	require.NoError(t, err)
	vms, err := armcompute.NewVirtualMachinesClient(e.subscription, cred, nil)
	require.NoError(t, err)
	vm, err := vms.Get(ctx, e.group, "control-plane-0", nil)
	require.NoError(t, err)
	assert.Equal(t, armcompute.SecurityTypesConfidentialVM, *vm.Properties.SecurityProfile.SecurityType)
	assert.True(t, *vm.Properties.SecurityProfile.UefiSettings.VTpmEnabled)

	require.NoError(t, prov.RebootNode(ctx, "control-plane-0"))
	require.NoError(t, prov.Stop(ctx))
	require.NoError(t, prov.Start(ctx))
}

// deleteGroup deletes the test's own resource group, with the image in it.
func deleteGroup(ctx context.Context, e env) error {
	cred, err := azidentity.NewDefaultAzureCredential(nil)
	if err != nil {
		return err
	}
	groups, err := armresources.NewResourceGroupsClient(e.subscription, cred, nil)
	if err != nil {
		return err
	}
	poller, err := groups.BeginDelete(ctx, e.group, nil)
	if err != nil {
		return err
	}
	_, err = poller.PollUntilDone(ctx, nil)
	return err
}

// testWriter writes progress lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
