// Package azurevolumes is the encrypted volume driver's storage on Azure (csidriver.Backing,
// the controller half): a managed disk per volume in the cluster's resource group, attached to
// the node's VM at a free LUN (1-63: LUN 0 is the node's state disk). The node half finds it at
// the LUN IMDS lists under the disk's name (azurenode). What Azure stores is LUKS2 with
// dm-integrity under the volume's key, which Azure never sees (docs/volumes.md).
//
// It touches only what is the cluster's: a disk or VM without the cluster's UID tag is never
// created over, attached, detached or deleted, whatever Kubernetes asks.
package azurevolumes

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// TagVolume is the tag of a volume's disk that holds the volume's id.
const TagVolume = "constellation-volume"

// gib is a GiB: Azure sizes disks in whole GiB.
const gib = 1 << 30

// Config is where the volumes live and how Resource Manager is reached.
type Config struct {
	// Subscription, ResourceGroup and Location are the cluster's; UID the cluster's UID
	// (azuremeta.TagUID), which every disk and VM the backing touches must carry.
	Subscription, ResourceGroup, Location, UID string
	// SKU is the disks' storage type ("": Premium_LRS, as the state disks').
	SKU armcompute.DiskStorageAccountTypes
	// Credential is the controller's identity; Options the clients' (tests: azuresim).
	Credential azcore.TokenCredential
	Options    *arm.ClientOptions
	// PollEvery is how often a long-running operation is polled (0: 2 s).
	PollEvery time.Duration
}

// Backing is the volumes' storage on Azure. Attach and Detach of one VM's disks run one at a
// time: the VM's data disk list is read, changed and written whole.
type Backing struct {
	cfg   Config
	disks *armcompute.DisksClient
	vms   *armcompute.VirtualMachinesClient

	mu    sync.Mutex
	perVM map[string]*sync.Mutex
}

var _ csidriver.Backing = (*Backing)(nil)

// New returns the backing of cfg's cluster. It contacts nothing until used.
func New(cfg Config) (*Backing, error) {
	if cfg.Subscription == "" || cfg.ResourceGroup == "" || cfg.Location == "" || cfg.UID == "" {
		return nil, errors.New("azure volumes: the subscription, resource group, location and cluster UID are required")
	}
	if cfg.SKU == "" {
		cfg.SKU = armcompute.DiskStorageAccountTypesPremiumLRS
	}
	if cfg.PollEvery == 0 {
		cfg.PollEvery = 2 * time.Second
	}
	f, err := armcompute.NewClientFactory(cfg.Subscription, cfg.Credential, cfg.Options)
	if err != nil {
		return nil, fmt.Errorf("azure volumes: creating the compute clients: %w", err)
	}
	return &Backing{cfg: cfg, disks: f.NewDisksClient(), vms: f.NewVirtualMachinesClient(), perVM: map[string]*sync.Mutex{}}, nil
}

// Create implements csidriver.Backing: an empty managed disk of bytes rounded up to GiB.
func (b *Backing) Create(ctx context.Context, id string, bytes int64) (csidriver.Volume, error) {
	if !csidriver.ValidID(id) {
		return csidriver.Volume{}, fmt.Errorf("volume id %q: not a volume id", id)
	}
	size := sizeGiB(bytes)
	existing, err := b.disk(ctx, id)
	if err == nil {
		if existing.Properties == nil || existing.Properties.DiskSizeGB == nil || *existing.Properties.DiskSizeGB != size {
			return csidriver.Volume{}, fmt.Errorf("volume %s: %w", id, csidriver.ErrExists)
		}
		return b.volume(id, existing), nil
	}
	if !errors.Is(err, csidriver.ErrNotFound) {
		return csidriver.Volume{}, err
	}
	poller, err := b.disks.BeginCreateOrUpdate(ctx, b.cfg.ResourceGroup, id, b.diskRequest(id, size), nil)
	if err != nil {
		return csidriver.Volume{}, fmt.Errorf("volume %s: creating its disk: %w", id, err)
	}
	resp, err := poller.PollUntilDone(ctx, b.poll())
	if err != nil {
		return csidriver.Volume{}, fmt.Errorf("volume %s: creating its disk: %w", id, err)
	}
	return b.volume(id, resp.Disk), nil
}

// diskRequest is a volume's empty disk, tagged with the cluster and the volume.
func (b *Backing) diskRequest(id string, size int32) armcompute.Disk {
	return armcompute.Disk{
		Location: &b.cfg.Location,
		Tags:     map[string]*string{azuremeta.TagUID: &b.cfg.UID, TagVolume: &id},
		SKU:      &armcompute.DiskSKU{Name: &b.cfg.SKU},
		Properties: &armcompute.DiskProperties{
			CreationData: &armcompute.CreationData{CreateOption: ptr(armcompute.DiskCreateOptionEmpty)},
			DiskSizeGB:   &size,
		},
	}
}

// Get implements csidriver.Backing.
func (b *Backing) Get(ctx context.Context, id string) (csidriver.Volume, error) {
	d, err := b.disk(ctx, id)
	if err != nil {
		return csidriver.Volume{}, err
	}
	return b.volume(id, d), nil
}

// Delete implements csidriver.Backing.
func (b *Backing) Delete(ctx context.Context, id string) error {
	d, err := b.disk(ctx, id)
	if errors.Is(err, csidriver.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if d.ManagedBy != nil {
		return fmt.Errorf("volume %s (on %s): %w", id, vmName(*d.ManagedBy), csidriver.ErrAttached)
	}
	poller, err := b.disks.BeginDelete(ctx, b.cfg.ResourceGroup, id, nil)
	if err == nil {
		_, err = poller.PollUntilDone(ctx, b.poll())
	}
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("volume %s: deleting its disk: %w", id, err)
	}
	return nil
}

// Expand implements csidriver.Backing: the disk grows to bytes rounded up to GiB.
func (b *Backing) Expand(ctx context.Context, id string, bytes int64) (int64, error) {
	d, err := b.disk(ctx, id)
	if err != nil {
		return 0, err
	}
	size := sizeGiB(bytes)
	have := *d.Properties.DiskSizeGB
	if size <= have {
		return int64(have) * gib, nil
	}
	poller, err := b.disks.BeginUpdate(ctx, b.cfg.ResourceGroup, id, armcompute.DiskUpdate{Properties: &armcompute.DiskUpdateProperties{DiskSizeGB: &size}}, nil)
	if err == nil {
		_, err = poller.PollUntilDone(ctx, b.poll())
	}
	if err != nil {
		return 0, fmt.Errorf("volume %s: growing its disk to %d GiB: %w", id, size, err)
	}
	return int64(size) * gib, nil
}

// disk reads a volume's disk: ErrNotFound if there is none, an error if it is not the
// cluster's volume.
func (b *Backing) disk(ctx context.Context, id string) (armcompute.Disk, error) {
	if !csidriver.ValidID(id) {
		return armcompute.Disk{}, fmt.Errorf("volume id %q: not a volume id: %w", id, csidriver.ErrNotFound)
	}
	resp, err := b.disks.Get(ctx, b.cfg.ResourceGroup, id, nil)
	if isNotFound(err) {
		return armcompute.Disk{}, fmt.Errorf("volume %s: %w", id, csidriver.ErrNotFound)
	}
	if err != nil {
		return armcompute.Disk{}, fmt.Errorf("volume %s: reading its disk: %w", id, err)
	}
	d := resp.Disk
	if tag(d.Tags, azuremeta.TagUID) != b.cfg.UID || tag(d.Tags, TagVolume) != id {
		return armcompute.Disk{}, fmt.Errorf("volume %s: the disk of that name is not this cluster's volume (tags %s=%q, %s=%q): refusing to touch it",
			id, azuremeta.TagUID, tag(d.Tags, azuremeta.TagUID), TagVolume, tag(d.Tags, TagVolume))
	}
	if d.Properties == nil || d.Properties.DiskSizeGB == nil {
		return armcompute.Disk{}, fmt.Errorf("volume %s: its disk has no size", id)
	}
	return d, nil
}

func (b *Backing) volume(id string, d armcompute.Disk) csidriver.Volume {
	v := csidriver.Volume{ID: id}
	if d.Properties != nil && d.Properties.DiskSizeGB != nil {
		v.Bytes = int64(*d.Properties.DiskSizeGB) * gib
	}
	if d.ManagedBy != nil {
		v.AttachedTo = vmName(*d.ManagedBy)
	}
	return v
}

func (b *Backing) poll() *runtime.PollUntilDoneOptions {
	return &runtime.PollUntilDoneOptions{Frequency: b.cfg.PollEvery}
}

// sizeGiB is bytes rounded up to whole GiB, at least 1.
func sizeGiB(bytes int64) int32 {
	n := (bytes + gib - 1) / gib
	if n < 1 {
		n = 1
	}
	return int32(n)
}

// vmName is the name of the VM a resource ID names: the node's (the host half names VMs by
// their nodes).
func vmName(id string) string { return id[strings.LastIndex(id, "/")+1:] }

func isNotFound(err error) bool {
	var re *azcore.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusNotFound
}

func tag(tags map[string]*string, k string) string {
	if v := tags[k]; v != nil {
		return *v
	}
	return ""
}

func ptr[T any](v T) *T { return &v }
