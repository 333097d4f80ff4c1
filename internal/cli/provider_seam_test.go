package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/provider/fake"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
)

// TestSecondProvider: the CLI's create, state, init-request and terminate paths work with a
// provider registered by one line (the fake, which runs nothing), with no code of the local
// provider involved: what a new provider touches is its own folder and its registration.
func TestSecondProvider(t *testing.T) {
	platform := fake.New()
	catalog.Register(platform)

	ws := t.TempDir()
	reference, err := platform.ReferenceValues("image-a")
	require.NoError(t, err)
	conf := config.Default()
	conf.Name = "fake-cluster"
	conf.Provider = config.ProviderFor(fake.Name, config.ProviderBlock{ControlPlanes: 1, Workers: 2, Image: "image-a"})
	conf.Attestation = config.AttestationFor(fake.Variant, config.VariantConfig{Measurements: measurements.ReferenceSets{{Name: "fake", Measurements: reference.Measurements}}})
	// Its configuration block is provider.fake, checked by its registered rules: the
	// configuration's schema names no provider.
	confPath := filepath.Join(ws, config.FileName)
	require.NoError(t, config.Write(confPath, conf, false))
	conf, err = config.Load(confPath)
	require.NoError(t, err)
	assert.Equal(t, fake.Name, conf.Provider.Name())

	var out bytes.Buffer
	st, err := createOn(t.Context(), newPhaseTimer(&out), filepath.Join(ws, state.FileName), platform, ws, conf, createOptions{})
	require.NoError(t, err)
	assert.Contains(t, out.String(), "3 nodes booting")
	assert.Equal(t, fake.Name, st.Provider)
	assert.Equal(t, "control-plane-0, worker-0, worker-1", nodeNames(st.Nodes))
	assert.Equal(t, metadata.ControlPlane, st.Nodes[0].Role)
	assert.Equal(t, "192.0.2.10:9000", st.InitEndpoint)

	// Every later command finds the provider by the state file's name.
	loaded, running, err := loadState(ws)
	require.NoError(t, err)
	assert.Equal(t, fake.Name, loaded.Provider)
	nodes, err := running.Nodes(t.Context())
	require.NoError(t, err)
	assert.Len(t, nodes, 3)
	require.NoError(t, running.Stop(t.Context()))
	nodes, err = running.Nodes(t.Context())
	require.NoError(t, err)
	assert.Equal(t, provider.Stopped, nodes[0].State)

	// The init request carries the provider's init secret and the cluster's attestation.
	ir, err := initRequest(t.Context(), ws, conf, loaded, running)
	require.NoError(t, err)
	assert.Equal(t, []byte("init secret of "+ws), ir.req.InitSecret)
	assert.Equal(t, []string{"127.0.0.1", "localhost", "192.0.2.1"}, ir.req.ApiServerCertSans, "the endpoint the kubeconfig names")
	ref, err := choose.DecodeReference(ir.req.AttestationReference)
	require.NoError(t, err)
	assert.Equal(t, fake.Variant, ref.Variant)

	// A platform whose nodes pull from registries has no image load.
	err = loadImages(t.Context(), &out, ws, []string{"app.tar"})
	assert.ErrorContains(t, err, "the fake platform's nodes pull their images from registries")

	// terminate removes it through the provider, and the files with it.
	out.Reset()
	require.NoError(t, terminate(t.Context(), &out, ws, false))
	assert.Contains(t, out.String(), "removed the cluster (3 nodes)")
	_, err = os.Stat(filepath.Join(ws, state.FileName))
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = platform.Open(ws)
	assert.ErrorIs(t, err, provider.ErrNotRunning, "the provider no longer has the cluster")
}

// TestUnknownProvider: a state file naming a provider the catalog does not know says so.
func TestUnknownProvider(t *testing.T) {
	_, err := providerOf(&state.State{Provider: "no-such-cloud"})
	assert.ErrorContains(t, err, `provider "no-such-cloud" is not supported by this CLI`)
}

// TestConfigChecksProviderRules: the CLI's configuration checks include the local provider's
// rules, which the catalog registers (internal/config itself names no provider's code).
func TestConfigChecksProviderRules(t *testing.T) {
	ws := t.TempDir()
	image := filepath.Join(ws, "image")
	writeImage(t, image, "v1")
	out, err := run(t, "-C", ws, "config", "generate", "local", "--image", image)
	require.NoError(t, err, out)
	path := filepath.Join(ws, config.FileName)
	c, err := config.Load(path)
	require.NoError(t, err)
	c.Network.PodCIDR = "10.42.0.0/16"
	err = config.Write(path, c, true)
	assert.ErrorContains(t, err, "network.podCIDR: 10.42.0.0/16 overlaps the local provider's node network 10.42.0.0/24")
	c.Network.PodCIDR = config.DefaultPodCIDR
	c.Provider.Block().Workers = 245
	err = config.Write(path, c, true)
	assert.ErrorContains(t, err, "provider.local: 1 control planes and 245 workers are 246 nodes, more than the 245 addresses")
}
