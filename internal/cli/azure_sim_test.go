package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/measuredboot"
	"github.com/openconstellation/constellation/internal/measuredboot/measuredboottest"
	"github.com/openconstellation/constellation/internal/provider/azure"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
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
		Image:    "/subscriptions/" + simSubscription + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/node/versions/1.0.0",
		Settings: map[string]any{"subscriptionID": simSubscription, "resourceGroup": "sim", "location": "westeurope", "vmSize": "Standard_DC8as_v5"},
	})
	conf.Attestation = config.AttestationFor(variant.AzureSEVSNP, config.VariantConfig{
		Measurements: measurements.ReferenceSets{{Name: "image", Measurements: measurementstest.Image(variant.AzureSEVSNP, nil)}},
	})
	conf.Attestation.Of(variant.AzureSEVSNP).SNP = testSNPReference()
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

// testSNPReference is a valid SEV-SNP reference (made-up values).
func testSNPReference() *snp.Reference {
	ref := snp.DefaultReference("milan")
	ref.Products = []string{"Milan"}
	ref.MinimumTCB = map[string]snp.TCB{"Milan": {Bootloader: 3, SNP: 8, Microcode: 115}}
	ref.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
	return &ref
}

// TestConfigGenerateAzure writes an Azure configuration from a node OS image folder, its
// stored copy's reference and a firmware record: the image's registers predicted, the
// firmware's as recorded, the record's variant and hardware reference, the settings given.
func TestConfigGenerateAzure(t *testing.T) {
	ws, image := t.TempDir(), t.TempDir()
	kernel := measuredboottest.PE([]measuredboottest.Section{{Name: ".text", Data: bytes.Repeat([]byte{0x90}, 1000)}}, nil)
	require.NoError(t, os.WriteFile(filepath.Join(image, "uki.efi"), measuredboottest.UKI([]byte("ID=debian\n"), []byte("ro"), kernel, []byte("initrd")), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(image, "disk.raw"), measuredboottest.GPT(0), 0o644))
	observed := measurements.M{}
	for _, r := range measuredboot.FirmwareRegisters {
		observed[r] = measurements.Measurement{Expected: bytes.Repeat([]byte{7}, 32)}
	}
	raw, err := json.Marshal(azure.FirmwareRecord{Variant: "azure-tdx", Source: "made up", Observed: observed, TDX: testTDXReference()})
	require.NoError(t, err)
	record := filepath.Join(t.TempDir(), "record.json")
	require.NoError(t, os.WriteFile(record, raw, 0o644))
	ref := "/subscriptions/" + simSubscription + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/node/versions/1.0.0"

	args := []string{"-C", ws, "config", "generate", "azure", "--image", image, "--image-ref", ref, "--firmware-record", record, "--workers", "2",
		"--set", "subscriptionID=" + simSubscription, "--set", "resourceGroup=prod", "--set", "location=westeurope", "--set", "stateDiskGiB=64"}
	out, err := run(t, args...)
	require.NoError(t, err, out)
	assert.Contains(t, out, "(Azure's firmware (observed: made up))")
	c, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	b := c.Provider.Block()
	assert.Equal(t, ref, b.Image)
	assert.Equal(t, map[string]any{"subscriptionID": simSubscription, "resourceGroup": "prod", "location": "westeurope", "stateDiskGiB": float64(64)}, b.Settings, "as YAML reads a number back")
	vals := c.Attestation.Of(variant.AzureTDX)
	require.NotNil(t, vals, "the record's variant")
	assert.NotNil(t, vals.TDX)
	assert.Equal(t, bytes.Repeat([]byte{7}, 32), vals.Measurements[0].Measurements[0].Expected)

	_, err = run(t, append(args[:len(args)-2:len(args)-2], "--force", "--set", "stateDiskGiB=lots")...)
	assert.ErrorContains(t, err, "provider.azure.settings.stateDiskGiB")
	_, err = run(t, "-C", ws, "config", "generate", "azure", "--image", image, "--image-ref", ref, "--force")
	assert.ErrorContains(t, err, `required flag(s) "firmware-record" not set`)
}

func testTDXReference() *tdx.Reference {
	return &tdx.Reference{
		Name: "tdx", MrSeam: []tdx.HexBytes{bytes.Repeat([]byte{2}, 48)}, TdAttributes: make(tdx.HexBytes, 8),
		Xfam: tdx.HexBytes{0xe7, 0x18, 0x06, 0, 0, 0, 0, 0}, MinimumTeeTcbSvn: make(tdx.HexBytes, 16),
	}
}
