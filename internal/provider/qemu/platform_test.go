package qemu

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/measuredboot"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
)

func TestCheckImages(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	req := provider.CreateRequest{
		Config: &config.Config{KubernetesVersion: "v1.34.4"},
		Nodes:  []provider.NodeSpec{{Name: "cp-0", Role: metadata.ControlPlane, Image: dir}},
	}
	assert.ErrorContains(t, checkImages(req), "node OS image of cp-0 (make vm-image)")
	write(DiskFile, "disk")
	write(UKIFile, "uki")
	assert.ErrorContains(t, checkImages(req), ManifestFile)
	write(ManifestFile, `{"kubernetesVersion":"v1.35.4","roothash":"00"}`)
	assert.ErrorContains(t, checkImages(req), "runs Kubernetes v1.35.4, but constellation-conf.yaml says kubernetesVersion v1.34.4")
	write(ManifestFile, `{"kubernetesVersion":"v1.34.4","roothash":"00"}`)
	assert.NoError(t, checkImages(req))
}

// The firmware registers come from the record of the firmware and shape the provider boots,
// never guessed: the default shape on Debian's OVMF has one; another shape has none, and the
// error says how to record one.
func TestFirmwareRecordOfTheShape(t *testing.T) {
	if testing.Short() {
		t.Skip("hashes Debian's OVMF")
	}
	_, err := os.Stat(DefaultShape.Firmware.Code)
	require.NoError(t, err, "Debian's ovmf is not installed: make deps installs it")
	rec, err := firmwareRecord(DefaultShape, nil)
	require.NoError(t, err, "the repository records the firmware of the default shape")
	assert.Equal(t, DefaultShape.measured(), rec.Shape)

	other := DefaultShape
	other.MemoryMiB = 8192
	_, err = firmwareRecord(other, nil)
	assert.True(t, errors.Is(err, measuredboot.ErrNoFirmwareRecord), err)
	assert.ErrorContains(t, err, "Recording the firmware registers")
	assert.ErrorContains(t, err, "--firmware-record")

	// A record the user made on their host for that shape (config generate qemu
	// --firmware-record) is found for it, and only for it.
	mine := rec
	mine.Shape = other.measured()
	raw, err := json.Marshal(mine)
	require.NoError(t, err)
	p, err := Platform{}.WithFirmwareRecord(raw)
	require.NoError(t, err)
	got, err := firmwareRecord(other, p.(Platform).records)
	require.NoError(t, err)
	assert.Equal(t, other.measured(), got.Shape)
	got, err = firmwareRecord(DefaultShape, p.(Platform).records)
	require.NoError(t, err)
	assert.Equal(t, DefaultShape.measured(), got.Shape)

	_, err = Platform{}.WithFirmwareRecord([]byte(`{"firmware": {}}`))
	assert.Error(t, err, "a record is validated as the built-in ones are")
}

// The machines' shape travels in the cluster spec as JSON: what the provider process boots
// is what Create decided.
func TestShapeRoundTrip(t *testing.T) {
	data, err := json.Marshal(DefaultShape)
	require.NoError(t, err)
	var got Shape
	require.NoError(t, json.Unmarshal(data, &got))
	assert.Equal(t, DefaultShape, got)
	assert.Equal(t, "q35,smm=on", DefaultShape.measured().Machine)
}

// Machines under TCG get longer default timeouts; under KVM, and when the cluster's spec
// cannot be read, the defaults.
func TestTimeoutFactor(t *testing.T) {
	for name, tc := range map[string]struct {
		spec string
		want int
	}{
		"tcg":     {spec: `{"machines": "qemu", "machineShape": {"accel": "tcg"}}`, want: tcgTimeoutFactor},
		"kvm":     {spec: `{"machines": "qemu", "machineShape": {"accel": "kvm"}}`, want: 1},
		"no spec": {want: 1},
	} {
		t.Run(name, func(t *testing.T) {
			ws := t.TempDir()
			if tc.spec != "" {
				dir := Platform{}.Folder(ws)
				require.NoError(t, os.MkdirAll(dir, 0o700))
				require.NoError(t, os.WriteFile(filepath.Join(dir, "spec.json"), []byte(tc.spec), 0o600))
			}
			assert.Equal(t, tc.want, Platform{}.TimeoutFactor(ws))
		})
	}
}
