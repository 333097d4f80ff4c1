package azure

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/pageblob"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/qemu"
	"github.com/openconstellation/constellation/internal/vhd"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// ImageUpload is a node OS image to make a gallery image version of (`constellation image
// upload azure`, docs/azure.md "Image upload").
type ImageUpload struct {
	// Disk is the node OS image's raw disk (make vm-image: disk.raw).
	Disk string
	// SubscriptionID, ResourceGroup and Location are where the gallery is (created if
	// missing).
	SubscriptionID, ResourceGroup, Location string
	// Gallery, Definition and Version name the image version: a gallery, an image
	// definition in it, and the version ("1.2.3").
	Gallery, Definition, Version string
}

// TagImageSHA256 is the tag of an image version that holds the SHA-256 of the raw disk it was
// made from: a rerun finds the version it made, and never takes another image's for it.
const TagImageSHA256 = "constellation-image-sha256"

// pageChunk is the size of one page upload: Azure's largest.
const pageChunk = 4 << 20

// uploadAccess is how long the upload's write access to the disk lasts.
const uploadAccess = 24 * time.Hour

var (
	galleryNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.]{0,78}[A-Za-z0-9]$`)
	definitionRE  = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]{0,78}[A-Za-z0-9]$`)
	versionRE     = regexp.MustCompile(`^\d{1,9}\.\d{1,9}\.\d{1,9}$`)
)

// Check names every problem of the request.
func (u ImageUpload) Check() error {
	s := Settings{SubscriptionID: u.SubscriptionID, ResourceGroup: u.ResourceGroup, Location: u.Location}.withDefaults()
	var problems []error
	for _, fe := range s.Check(variant.Variant{}) {
		problems = append(problems, fe)
	}
	if !galleryNameRE.MatchString(u.Gallery) {
		problems = append(problems, fmt.Errorf("gallery %q: letters, digits, '_' and '.', 2 to 80", u.Gallery))
	}
	if !definitionRE.MatchString(u.Definition) {
		problems = append(problems, fmt.Errorf("image definition %q: letters, digits, '-', '_' and '.', 2 to 80", u.Definition))
	}
	if !versionRE.MatchString(u.Version) {
		problems = append(problems, fmt.Errorf("version %q: MAJOR.MINOR.PATCH, numbers", u.Version))
	}
	return errors.Join(problems...)
}

// UploadImage implements provider.ImageUploader: req's settings are subscriptionID,
// resourceGroup, location (required), gallery (default "constellation") and definition
// (default "node"); the image folder's disk.raw is uploaded (Upload).
func (p Platform) UploadImage(ctx context.Context, req provider.ImageUploadRequest) (string, error) {
	u := ImageUpload{Disk: filepath.Join(req.Image, qemu.DiskFile), Version: req.Version, Gallery: "constellation", Definition: "node"}
	var unknown []string
	for k, v := range req.Settings {
		switch k {
		case "subscriptionID":
			u.SubscriptionID = v
		case "resourceGroup":
			u.ResourceGroup = v
		case "location":
			u.Location = v
		case "gallery":
			u.Gallery = v
		case "definition":
			u.Definition = v
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return "", fmt.Errorf("unknown settings %s (known: subscriptionID, resourceGroup, location, gallery, definition)", strings.Join(unknown, ", "))
	}
	return p.Upload(ctx, u)
}

// Upload makes a gallery image version of the node OS image's disk: the disk as a fixed
// VHD into a temporary managed disk, the gallery and image definition (a specialized Linux
// image, Gen2, x64, for confidential VMs) if missing, the version from the disk, then the
// disk removed. It returns the version's resource ID, what provider.azure.image names.
// A rerun finds a version of the same image (its disk's SHA-256) and returns it; a version of
// another image under that number is refused.
func (p Platform) Upload(ctx context.Context, u ImageUpload) (string, error) {
	if err := u.Check(); err != nil {
		return "", err
	}
	digest, size, err := diskDigest(u.Disk)
	if err != nil {
		return "", err
	}
	cred, err := p.credential()
	if err != nil {
		return "", err
	}
	c, err := newClients(u.SubscriptionID, cred, ClientOptions(p.Transport))
	if err != nil {
		return "", err
	}
	p.adjust(c)
	up := &uploader{clients: c, u: u, digest: digest, size: size}
	return up.run(ctx)
}

type uploader struct {
	*clients
	u      ImageUpload
	digest string
	size   int64
}

func (up *uploader) versionID() string {
	u := up.u
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/galleries/%s/images/%s/versions/%s",
		u.SubscriptionID, u.ResourceGroup, u.Gallery, u.Definition, u.Version)
}

func (up *uploader) run(ctx context.Context) (string, error) {
	u := up.u
	existing, found, err := get(ctx, up.clients, "read image version "+u.Version, func(ctx context.Context) (armcompute.GalleryImageVersionsClientGetResponse, error) {
		return up.versions.Get(ctx, u.ResourceGroup, u.Gallery, u.Definition, u.Version, nil)
	})
	if err != nil {
		return "", err
	}
	if found {
		if got := tag(existing.Tags, TagImageSHA256); got != up.digest {
			return "", &Error{What: "create image version " + u.Version, Kind: ErrConflict,
				Err: fmt.Errorf("version %s exists and was made from another disk (%s %q, this one is %s): choose another version", u.Version, TagImageSHA256, got, up.digest)}
		}
		provider.Progressf(ctx, "Azure: image version %s exists, made from this disk", u.Version)
		return up.versionID(), nil
	}
	l := layout{Subscription: u.SubscriptionID, ResourceGroup: u.ResourceGroup, Location: u.Location}
	if err := up.ensureGroup(ctx, l); err != nil {
		return "", err
	}
	diskID, err := up.uploadDisk(ctx)
	if err != nil {
		return "", err
	}
	if err := up.ensureDefinition(ctx); err != nil {
		return "", err
	}
	provider.Progressf(ctx, "Azure: creating image version %s (Azure copies the disk: minutes)", u.Version)
	if _, err := put(ctx, up.clients, "create image version "+u.Version, func(ctx context.Context) (*runtime.Poller[armcompute.GalleryImageVersionsClientCreateOrUpdateResponse], error) {
		return up.versions.BeginCreateOrUpdate(ctx, u.ResourceGroup, u.Gallery, u.Definition, u.Version, imageVersionRequest(u, diskID, up.digest), nil)
	}); err != nil {
		return "", err
	}
	return up.versionID(), up.removeUploadDisk(ctx)
}

// uploadDisk uploads the disk into a fresh managed disk and returns its ID. A disk left by an
// interrupted run is removed first: whether its upload finished is not known.
func (up *uploader) uploadDisk(ctx context.Context) (string, error) {
	u := up.u
	if err := up.removeUploadDisk(ctx); err != nil {
		return "", err
	}
	name := up.uploadDiskName()
	blobSize := vhd.AlignedSize(up.size) + vhd.FooterSize
	if _, err := put(ctx, up.clients, "create upload disk "+name, func(ctx context.Context) (*runtime.Poller[armcompute.DisksClientCreateOrUpdateResponse], error) {
		return up.disks.BeginCreateOrUpdate(ctx, u.ResourceGroup, name, uploadDiskRequest(u, blobSize), nil)
	}); err != nil {
		return "", err
	}
	access, err := put(ctx, up.clients, "grant write access to "+name, func(ctx context.Context) (*runtime.Poller[armcompute.DisksClientGrantAccessResponse], error) {
		return up.disks.BeginGrantAccess(ctx, u.ResourceGroup, name, armcompute.GrantAccessData{
			Access: ptr(armcompute.AccessLevelWrite), DurationInSeconds: ptr(int32(uploadAccess / time.Second)),
		}, nil)
	})
	if err != nil {
		return "", err
	}
	if access.AccessSAS == nil {
		return "", &Error{What: "grant write access to " + name, Err: errors.New("no upload address in the answer")}
	}
	if err := up.uploadPages(ctx, *access.AccessSAS); err != nil {
		return "", err
	}
	if _, err := put(ctx, up.clients, "revoke write access to "+name, func(ctx context.Context) (*runtime.Poller[armcompute.DisksClientRevokeAccessResponse], error) {
		return up.disks.BeginRevokeAccess(ctx, u.ResourceGroup, name, nil)
	}); err != nil {
		return "", err
	}
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/disks/%s", u.SubscriptionID, u.ResourceGroup, name), nil
}

func (up *uploader) uploadDiskName() string {
	return up.u.Definition + "-" + strings.ReplaceAll(up.u.Version, ".", "-") + "-upload"
}

func (up *uploader) removeUploadDisk(ctx context.Context) error {
	name := up.uploadDiskName()
	// A disk of an interrupted upload may still be open for writing: Azure deletes it only
	// once that access is revoked.
	if _, found, err := get(ctx, up.clients, "read upload disk "+name, func(ctx context.Context) (armcompute.DisksClientGetResponse, error) {
		return up.disks.Get(ctx, up.u.ResourceGroup, name, nil)
	}); err != nil {
		return err
	} else if found {
		if _, err := put(ctx, up.clients, "revoke write access to "+name, func(ctx context.Context) (*runtime.Poller[armcompute.DisksClientRevokeAccessResponse], error) {
			return up.disks.BeginRevokeAccess(ctx, up.u.ResourceGroup, name, nil)
		}); err != nil {
			return err
		}
	}
	return remove(ctx, up.clients, "delete upload disk "+name, func(ctx context.Context) (*runtime.Poller[armcompute.DisksClientDeleteResponse], error) {
		return up.disks.BeginDelete(ctx, up.u.ResourceGroup, name, nil)
	})
}

// uploadPages writes the disk, zero-padded to Azure's alignment, and the VHD footer into the
// managed disk's page blob at sas. Zero chunks are skipped: a new disk reads zeros.
func (up *uploader) uploadPages(ctx context.Context, sas string) error {
	client, err := pageblob.NewClientWithNoCredential(sas, nil)
	if err != nil {
		return fmt.Errorf("the upload address: %w", err)
	}
	f, err := os.Open(up.u.Disk)
	if err != nil {
		return err
	}
	defer f.Close()
	aligned := vhd.AlignedSize(up.size)
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return err
	}
	footer, err := vhd.Footer(aligned, time.Now(), id)
	if err != nil {
		return err
	}
	start, reported := time.Now(), time.Now()
	buf := make([]byte, pageChunk)
	for off := int64(0); off < aligned; off += pageChunk {
		n := min(int64(pageChunk), aligned-off)
		chunk := buf[:n]
		clear(chunk)
		if _, err := f.ReadAt(chunk, off); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading %s: %w", up.u.Disk, err)
		}
		if !isZero(chunk) {
			if err := up.putPages(ctx, client, chunk, off); err != nil {
				return err
			}
		}
		if time.Since(reported) >= progressEvery {
			provider.Progressf(ctx, "Azure: uploaded %d of %d MiB (%s)", off>>20, aligned>>20, time.Since(start).Round(time.Second))
			reported = time.Now()
		}
	}
	return up.putPages(ctx, client, footer[:], aligned)
}

func (up *uploader) putPages(ctx context.Context, client *pageblob.Client, data []byte, off int64) error {
	return up.call(ctx, fmt.Sprintf("upload the disk's bytes at %d", off), func(ctx context.Context) error {
		_, err := client.UploadPages(ctx, streaming.NopCloser(bytes.NewReader(data)), blob.HTTPRange{Offset: off, Count: int64(len(data))}, nil)
		return err
	})
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// ensureDefinition creates the gallery and the image definition if they are missing.
func (up *uploader) ensureDefinition(ctx context.Context) error {
	u := up.u
	if _, err := put(ctx, up.clients, "create gallery "+u.Gallery, func(ctx context.Context) (*runtime.Poller[armcompute.GalleriesClientCreateOrUpdateResponse], error) {
		return up.galleries.BeginCreateOrUpdate(ctx, u.ResourceGroup, u.Gallery, armcompute.Gallery{Location: ptr(u.Location)}, nil)
	}); err != nil {
		return err
	}
	_, err := put(ctx, up.clients, "create image definition "+u.Definition, func(ctx context.Context) (*runtime.Poller[armcompute.GalleryImagesClientCreateOrUpdateResponse], error) {
		return up.images.BeginCreateOrUpdate(ctx, u.ResourceGroup, u.Gallery, u.Definition, imageDefinitionRequest(u), nil)
	})
	return err
}

// diskDigest is the SHA-256 of the disk at path and its size.
func diskDigest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("the node OS image's disk: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("reading %s: %w", path, err)
	}
	if n == 0 {
		return "", 0, fmt.Errorf("the node OS image's disk %s is empty", path)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// uploadDiskRequest is the temporary disk the image is uploaded into.
func uploadDiskRequest(u ImageUpload, blobSize int64) armcompute.Disk {
	return armcompute.Disk{
		Location: ptr(u.Location),
		SKU:      &armcompute.DiskSKU{Name: ptr(armcompute.DiskStorageAccountTypesStandardLRS)},
		Properties: &armcompute.DiskProperties{
			OSType:           ptr(armcompute.OperatingSystemTypesLinux),
			HyperVGeneration: ptr(armcompute.HyperVGenerationV2),
			CreationData:     &armcompute.CreationData{CreateOption: ptr(armcompute.DiskCreateOptionUpload), UploadSizeBytes: ptr(blobSize)},
		},
	}
}

// imageDefinitionRequest is the image definition: specialized (no provisioning agent, no OS
// profile), Linux, Gen2, x64, for confidential VMs whose guest state is not shipped with
// the image (ConfidentialVMSupported).
func imageDefinitionRequest(u ImageUpload) armcompute.GalleryImage {
	return armcompute.GalleryImage{
		Location: ptr(u.Location),
		Properties: &armcompute.GalleryImageProperties{
			Identifier:       &armcompute.GalleryImageIdentifier{Publisher: ptr("openconstellation"), Offer: ptr("constellation"), SKU: ptr(u.Definition)},
			OSType:           ptr(armcompute.OperatingSystemTypesLinux),
			OSState:          ptr(armcompute.OperatingSystemStateTypesSpecialized),
			HyperVGeneration: ptr(armcompute.HyperVGenerationV2),
			Architecture:     ptr(armcompute.ArchitectureX64),
			Features:         []*armcompute.GalleryImageFeature{{Name: ptr("SecurityType"), Value: ptr("ConfidentialVMSupported")}},
		},
	}
}

// imageVersionRequest is the image version made from the uploaded disk, tagged with its
// SHA-256.
func imageVersionRequest(u ImageUpload, diskID, digest string) armcompute.GalleryImageVersion {
	return armcompute.GalleryImageVersion{
		Location: ptr(u.Location),
		Tags:     map[string]*string{TagImageSHA256: ptr(digest)},
		Properties: &armcompute.GalleryImageVersionProperties{
			StorageProfile: &armcompute.GalleryImageVersionStorageProfile{OSDiskImage: &armcompute.GalleryOSDiskImage{
				HostCaching: ptr(armcompute.HostCachingReadOnly),
				Source:      &armcompute.GalleryDiskImageSource{ID: ptr(diskID)},
			}},
			PublishingProfile: &armcompute.GalleryImageVersionPublishingProfile{
				ReplicaCount:       ptr[int32](1),
				StorageAccountType: ptr(armcompute.StorageAccountTypePremiumLRS),
				TargetRegions:      []*armcompute.TargetRegion{{Name: ptr(u.Location), RegionalReplicaCount: ptr[int32](1)}},
			},
		},
	}
}
