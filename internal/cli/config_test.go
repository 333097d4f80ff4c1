package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// run executes the CLI with args and returns its output.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// writeImage creates a node image directory whose files have distinct content.
func writeImage(t *testing.T, dir, variant string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, name := range local.ImageFiles() {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(variant+" "+name), 0o644))
	}
}

func TestConfigGenerateLocal(t *testing.T) {
	ws := t.TempDir()
	image := filepath.Join(ws, "image")
	writeImage(t, image, "v1")

	out, err := run(t, "-C", ws, "config", "generate", "local", "--image", image, "--control-planes", "3", "--workers", "2", "--name", "demo")
	require.NoError(t, err, out)
	assert.Contains(t, out, "Wrote "+filepath.Join(ws, config.FileName))
	assert.Contains(t, out, "(kubelet, kubeadm)")

	c, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err, "the written file loads and validates")
	assert.Equal(t, "demo", c.Name)
	assert.Equal(t, &config.ProviderBlock{ControlPlanes: 3, Workers: 2, Image: "image"}, c.Provider.Block(), "image inside the workspace is stored relative to it")
	assert.Equal(t, image, c.Provider.Block().ImagePath(ws))
	assert.Equal(t, config.DefaultKubernetesVersion, c.KubernetesVersion)
	assert.Contains(t, out, "Kubernetes "+config.DefaultKubernetesVersion)
	assert.Equal(t, config.NetworkConfig{PodCIDR: config.DefaultPodCIDR, ServiceCIDR: config.DefaultServiceCIDR, Outbound: config.OutboundNAT}, c.Network)

	// The reference values are exactly what a node booting this image shows.
	components, err := local.ImageComponents(image)
	require.NoError(t, err)
	want := softfirmware.ExpectedPCRs(components)
	require.Len(t, c.Attestation.Of(variant.QEMUVTPM).Measurements, 1)
	set := c.Attestation.Of(variant.QEMUVTPM).Measurements[0]
	assert.Equal(t, want, set.Measurements)
	assert.Equal(t, config.ReferenceSetName("local-", want), set.Name)
	for _, pcr := range []uint32{local.PCRBootstrapper, local.PCRNodeConfig, local.PCRKubernetes} {
		assert.Contains(t, out, "PCR "+itoa(pcr))
	}

	// An existing configuration is kept...
	writeImage(t, image, "v2")
	out, err = run(t, "-C", ws, "config", "generate", "local", "--image", image)
	require.Error(t, err)
	assert.ErrorContains(t, err, "refusing to overwrite "+filepath.Join(ws, config.FileName)+" (use --force")
	assert.ErrorIs(t, err, os.ErrExist)
	kept, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	assert.Equal(t, c, kept, out)

	// ...unless --force: then it holds the new image's values.
	_, err = run(t, "-C", ws, "config", "generate", "local", "--image", image, "--force")
	require.NoError(t, err)
	replaced, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	components, err = local.ImageComponents(image)
	require.NoError(t, err)
	assert.Equal(t, softfirmware.ExpectedPCRs(components), replaced.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements)
	assert.NotEqual(t, set.Name, replaced.Attestation.Of(variant.QEMUVTPM).Measurements[0].Name, "a new image gets a new set name")
	assert.Equal(t, &config.ProviderBlock{ControlPlanes: 1, Workers: 1, Image: "image"}, replaced.Provider.Block(), "flag defaults")

	// --kubernetes-version goes into the configuration.
	out, err = run(t, "-C", ws, "config", "generate", "local", "--image", image, "--force", "--kubernetes-version", "v1.35.4")
	require.NoError(t, err, out)
	assert.Contains(t, out, "Kubernetes v1.35.4")
	v135, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	assert.Equal(t, "v1.35.4", v135.KubernetesVersion)
}

func TestConfigGenerateLocalImageOutsideWorkspace(t *testing.T) {
	ws := filepath.Join(t.TempDir(), "new-workspace")
	image := filepath.Join(t.TempDir(), "image")
	writeImage(t, image, "v1")
	_, err := run(t, "--workspace", ws, "config", "generate", "local", "--image", image, "--workers", "0")
	require.NoError(t, err, "the workspace is created")
	c, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	assert.Equal(t, image, c.Provider.Block().Image, "absolute outside the workspace")
}

func TestConfigGenerateLocalErrors(t *testing.T) {
	ws := t.TempDir()
	image := filepath.Join(ws, "image")
	writeImage(t, image, "v1")
	testCases := map[string]struct {
		args    []string
		wantErr []string
	}{
		"no image, no container images": {args: []string{"--images", filepath.Join(ws, "no-images")}, wantErr: []string{"laying out the default node image", "run 'make images' first"}},
		"image missing":                 {args: []string{"--image", filepath.Join(ws, "nope")}, wantErr: []string{"node image directory", "no such file"}},
		"image is a file":               {args: []string{"--image", filepath.Join(image, "kubelet")}, wantErr: []string{"is not a directory"}},
		"no control planes": {
			args:    []string{"--image", image, "--control-planes", "0", "--workers", "-1"},
			wantErr: []string{"provider.local.controlPlanes: must be at least 1, got 0", "provider.local.workers: must be at least 0, got -1"},
		},
		"bad name": {args: []string{"--image", image, "--name", "My_Cluster"}, wantErr: []string{`name: "My_Cluster" is not a DNS label`}},
		"unsupported Kubernetes, default image": {
			args:    []string{"--kubernetes-version", "v1.33.0"},
			wantErr: []string{"laying out the default node image", `kubernetesVersion "v1.33.0" is not supported (supported: v1.34.4, v1.35.4)`},
		},
		"unsupported Kubernetes, given image": {
			args:    []string{"--image", image, "--kubernetes-version", "v1.35"},
			wantErr: []string{`kubernetesVersion: "v1.35" is not supported (supported: v1.34.4, v1.35.4)`},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := run(t, append([]string{"-C", ws, "config", "generate", "local"}, tc.args...)...)
			require.Error(t, err)
			for _, want := range tc.wantErr {
				assert.ErrorContains(t, err, want)
			}
			_, statErr := os.Stat(filepath.Join(ws, config.FileName))
			assert.ErrorIs(t, statErr, os.ErrNotExist, "nothing written")
		})
	}

	// An incomplete image names every missing file.
	require.NoError(t, os.Remove(filepath.Join(image, "kubeadm")))
	require.NoError(t, os.Remove(filepath.Join(image, "containerd.toml")))
	_, err := run(t, "-C", ws, "config", "generate", "local", "--image", image)
	require.Error(t, err)
	assert.ErrorContains(t, err, "measuring kubeadm")
	assert.ErrorContains(t, err, "measuring containerd.toml")
}

func TestImagePathFor(t *testing.T) {
	ws := t.TempDir()
	assert.Equal(t, filepath.Join("a", "b"), imagePathFor(ws, filepath.Join(ws, "a", "b")))
	assert.Equal(t, ".", imagePathFor(ws, ws))
	outside := filepath.Join(filepath.Dir(ws), "other")
	assert.Equal(t, outside, imagePathFor(ws, outside))
	assert.Equal(t, filepath.Join(ws, "..x"), filepath.Join(ws, imagePathFor(ws, filepath.Join(ws, "..x"))), "a name starting with .. is inside")
}

func itoa(i uint32) string { return strconv.FormatUint(uint64(i), 10) }

// config generate qemu --firmware-record reads and validates the record before anything
// else, naming the file.
func TestConfigGenerateQEMUFirmwareRecordRefused(t *testing.T) {
	ws := t.TempDir()
	image := t.TempDir()
	missing := filepath.Join(ws, "missing.json")
	_, err := run(t, "config", "generate", "qemu", "-C", ws, "--image", image, "--firmware-record", missing)
	assert.ErrorContains(t, err, "firmware record")
	assert.ErrorIs(t, err, os.ErrNotExist)

	bad := filepath.Join(ws, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"firmware": {"package": "ovmf"}, "observed": {"4": "00"}}`), 0o600))
	_, err = run(t, "config", "generate", "qemu", "-C", ws, "--image", image, "--firmware-record", bad)
	assert.ErrorContains(t, err, "firmware record "+bad)
	assert.ErrorContains(t, err, "observed PCR 4 is not a firmware register")
	_, err = os.Stat(filepath.Join(ws, config.FileName))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing written")
}
