package azure

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim"
	"github.com/openconstellation/constellation/internal/vhd"
)

// testDisk writes a raw disk of size bytes with data at a few places (the rest zero) and
// returns its path and SHA-256.
func testDisk(t *testing.T, size int) (string, string) {
	t.Helper()
	raw := make([]byte, size)
	copy(raw, "GPT header")
	copy(raw[size/2:], "the root")
	copy(raw[size-7:], "the end")
	path := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	sum := sha256.Sum256(raw)
	return path, hex.EncodeToString(sum[:])
}

func TestUploadImage(t *testing.T) {
	cloud := azuresim.New(testSub, azuresim.Hooks{})
	t.Cleanup(cloud.ServeBlobs())
	p := simPlatform(cloud)
	ctx := t.Context()
	const size = 9<<20 + 4096 // not aligned: padded to 10 MiB
	disk, digest := testDisk(t, size)
	u := ImageUpload{Disk: disk, SubscriptionID: testSub, ResourceGroup: "images", Location: "westeurope",
		Gallery: "constellation", Definition: "node", Version: "1.0.0"}

	id, err := p.Upload(ctx, u)
	require.NoError(t, err)
	assert.Equal(t, "/subscriptions/"+testSub+"/resourceGroups/images/providers/Microsoft.Compute/galleries/constellation/images/node/versions/1.0.0", id)
	assert.Regexp(t, imageIDRE, id, "what provider.azure.image takes")

	v, uploaded, ok := cloud.ImageVersion(id)
	require.True(t, ok)
	assert.Equal(t, digest, *v.Tags[TagImageSHA256])
	// The blob is the disk, zeros to 10 MiB, and a fixed VHD footer of 10 MiB.
	require.Len(t, uploaded, 10<<20+vhd.FooterSize)
	raw, err := os.ReadFile(disk)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(raw, uploaded[:size]), "the disk's bytes")
	assert.True(t, isZero(uploaded[size:10<<20]), "the padding")
	footer := uploaded[10<<20:]
	assert.Equal(t, "conectix", string(footer[:8]))
	assert.Equal(t, uint64(10<<20), binary.BigEndian.Uint64(footer[48:56]))
	assert.Equal(t, uint32(2), binary.BigEndian.Uint32(footer[60:64]), "fixed")
	assert.Empty(t, cloud.Resources("images")[1:], "only the gallery is left: the upload disk is gone")

	def, ok := cloud.ImageDefinition("images", "constellation", "node")
	require.True(t, ok)
	assert.Equal(t, armcompute.OperatingSystemStateTypesSpecialized, *def.Properties.OSState)
	assert.Equal(t, "ConfidentialVMSupported", *def.Properties.Features[0].Value)

	// A rerun finds the version made from this disk.
	again, err := p.Upload(ctx, u)
	require.NoError(t, err)
	assert.Equal(t, id, again)
	assert.Equal(t, 1, cloud.Count("GalleryImageVersionsClient.BeginCreateOrUpdate"))

	// Another disk under the same version is refused.
	other, _ := testDisk(t, 2<<20)
	u.Disk = other
	_, err = p.Upload(ctx, u)
	require.ErrorIs(t, err, ErrConflict)
	assert.ErrorContains(t, err, "version 1.0.0 exists and was made from another disk")
}

// TestUploadImageAfterAnInterruptedRun: a run that died with the disk open for writing
// leaves it; the rerun revokes the access, deletes it and uploads again.
func TestUploadImageAfterAnInterruptedRun(t *testing.T) {
	cloud := azuresim.New(testSub, azuresim.Hooks{})
	t.Cleanup(cloud.ServeBlobs())
	p := simPlatform(cloud)
	disk, _ := testDisk(t, 6<<20)
	u := ImageUpload{Disk: disk, SubscriptionID: testSub, ResourceGroup: "images", Location: "westeurope",
		Gallery: "constellation", Definition: "node", Version: "1.0.1"}
	cloud.Inject(azuresim.Fault{API: "DisksClient.BeginRevokeAccess", Status: http.StatusBadRequest, Code: "InvalidParameter"})
	_, err := p.Upload(t.Context(), u)
	require.Error(t, err)

	id, err := p.Upload(t.Context(), u)
	require.NoError(t, err)
	_, uploaded, ok := cloud.ImageVersion(id)
	require.True(t, ok)
	raw, _ := os.ReadFile(disk)
	assert.True(t, bytes.Equal(raw, uploaded[:len(raw)]))
}

func TestUploadImageRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		edit    func(*ImageUpload)
		wantErr string
	}{
		"bad version":  {edit: func(u *ImageUpload) { u.Version = "v1" }, wantErr: `version "v1": MAJOR.MINOR.PATCH`},
		"bad gallery":  {edit: func(u *ImageUpload) { u.Gallery = "my-gallery" }, wantErr: `gallery "my-gallery"`},
		"no location":  {edit: func(u *ImageUpload) { u.Location = "" }, wantErr: "location"},
		"missing disk": {edit: func(u *ImageUpload) { u.Disk = "/nonexistent/disk.raw" }, wantErr: "the node OS image's disk"},
	} {
		t.Run(name, func(t *testing.T) {
			cloud := azuresim.New(testSub, azuresim.Hooks{})
			u := ImageUpload{Disk: "x", SubscriptionID: testSub, ResourceGroup: "images", Location: "westeurope", Gallery: "gallery", Definition: "node", Version: "1.0.0"}
			tc.edit(&u)
			_, err := simPlatform(cloud).Upload(t.Context(), u)
			assert.ErrorContains(t, err, tc.wantErr)
			assert.Empty(t, cloud.Calls())
		})
	}
}

func TestUploadImageSettings(t *testing.T) {
	cloud := azuresim.New(testSub, azuresim.Hooks{})
	t.Cleanup(cloud.ServeBlobs())
	disk, _ := testDisk(t, 1<<20)
	ref, err := simPlatform(cloud).UploadImage(t.Context(), provider.ImageUploadRequest{
		Image: filepath.Dir(disk), Version: "2.0.0",
		Settings: map[string]string{"subscriptionID": testSub, "resourceGroup": "images", "location": "westeurope"},
	})
	require.NoError(t, err)
	assert.Contains(t, ref, "/galleries/constellation/images/node/versions/2.0.0")

	_, err = simPlatform(cloud).UploadImage(t.Context(), provider.ImageUploadRequest{
		Image: filepath.Dir(disk), Version: "2.0.0", Settings: map[string]string{"subscription": testSub, "zone": "1"},
	})
	assert.ErrorContains(t, err, "unknown settings subscription, zone (known: subscriptionID, resourceGroup, location, gallery, definition)")
}
