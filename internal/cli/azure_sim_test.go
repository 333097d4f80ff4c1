package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider/azure"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

const simSubscription = "00000000-0000-0000-0000-0000000000aa"

// TestAzureOnTheSimulatedCloud runs the CLI's own create, status, stop/start and terminate on
// an Azure configuration, with the catalog's Azure platform pointed at the simulated cloud:
// the configuration file is the user's, its provider block Azure's.
func TestAzureOnTheSimulatedCloud(t *testing.T) {
	cloud := azuresim.New(simSubscription, azuresim.Hooks{})
	catalog.Register(azure.Platform{Credential: azuresim.Credential, Transport: cloud.Transport(), PollEvery: time.Millisecond})
	t.Cleanup(func() { catalog.Register(azure.Platform{}) })

	ws := t.TempDir()
	conf := config.Default()
	conf.Name = "sim"
	conf.Provider = config.ProviderFor(azure.Name, config.ProviderBlock{ControlPlanes: 1, Workers: 1,
		Image: "/subscriptions/" + simSubscription + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/node/versions/1.0.0",
		Settings: map[string]any{"subscriptionID": simSubscription, "resourceGroup": "sim", "location": "westeurope", "vmSize": "Standard_DC8as_v5"},
	})
	ref := snp.DefaultReference("milan")
	ref.Products = []string{"Milan"}
	ref.MinimumTCB = map[string]snp.TCB{"Milan": {Bootloader: 3, SNP: 8, Microcode: 115}}
	ref.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
	conf.Attestation = config.AttestationFor(variant.AzureSEVSNP, config.VariantConfig{
		Measurements: measurements.ReferenceSets{{Name: "image", Measurements: measurementstest.Image(variant.AzureSEVSNP, nil)}},
	})
	conf.Attestation.Of(variant.AzureSEVSNP).SNP = &ref
	confPath := filepath.Join(ws, config.FileName)
	require.NoError(t, config.Write(confPath, conf, false))
	conf, err := config.Load(confPath)
	require.NoError(t, err)

	platform, err := catalog.Lookup(azure.Name)
	require.NoError(t, err)
	var out bytes.Buffer
	st, err := createOn(t.Context(), newPhaseTimer(&out), filepath.Join(ws, state.FileName), platform, ws, conf, createOptions{})
	require.NoError(t, err)
	assert.Equal(t, azure.Name, st.Provider)
	assert.Equal(t, "control-plane-0, worker-0", nodeNames(st.Nodes))
	vm, ok := cloud.VM("sim", "worker-0")
	require.True(t, ok)
	assert.Equal(t, "Standard_DC8as_v5", string(*vm.Properties.HardwareProfile.VMSize), "the configuration's size")

	_, running, err := loadState(ws)
	require.NoError(t, err)
	nodes, err := running.Nodes(t.Context())
	require.NoError(t, err)
	assert.Len(t, nodes, 2)
	require.NoError(t, running.Stop(t.Context()))
	assert.Equal(t, "deallocated", cloud.Power("sim", "control-plane-0"))
	require.NoError(t, running.Start(t.Context()))

	// No credential, no secret, in the workspace: the record and the init secret only.
	entries, err := os.ReadDir(filepath.Join(ws, azure.Folder))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"cluster.json", "init-secret"}, names)

	out.Reset()
	require.NoError(t, terminate(t.Context(), &out, ws, false))
	assert.Contains(t, out.String(), "removed the cluster (2 nodes)")
	assert.Empty(t, cloud.Groups(), "every resource and the group the provider created are gone")
	_, err = os.Stat(filepath.Join(ws, azure.Folder))
	assert.ErrorIs(t, err, os.ErrNotExist)
}
