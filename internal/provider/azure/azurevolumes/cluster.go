package azurevolumes

import (
	"context"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// ClusterBacking is the backing of the cluster of the VM it runs on (the volume driver's
// controller runs on the control planes): the subscription, group, location and cluster UID
// come from IMDS, once; Resource Manager is called with the VM's managed identity.
type ClusterBacking struct {
	IMDS azuremeta.IMDS
	// Credential replaces the VM's managed identity, Options Azure's public cloud (tests); the
	// managed identity's token requests go through Options' transport.
	Credential azcore.TokenCredential
	Options    *arm.ClientOptions

	mu      sync.Mutex
	backing *Backing
}

var _ csidriver.Backing = (*ClusterBacking)(nil)

// NewClusterBacking returns the backing of the cluster of the VM whose IMDS is at imdsURL
// ("": azuremeta.IMDSURL). It contacts nothing until used.
func NewClusterBacking(imdsURL string) *ClusterBacking {
	if imdsURL == "" {
		imdsURL = azuremeta.IMDSURL
	}
	return &ClusterBacking{IMDS: azuremeta.IMDS{BaseURL: imdsURL}}
}

func (c *ClusterBacking) get(ctx context.Context) (*Backing, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.backing != nil {
		return c.backing, nil
	}
	inst, err := c.IMDS.ClusterInstance(ctx)
	if err != nil {
		return nil, err
	}
	cred := c.Credential
	if cred == nil {
		// The volumes' identity, which only control planes carry.
		if cred, err = azuremeta.ManagedIdentity(inst, azuremeta.TagVolumesIdentity, c.Options); err != nil {
			return nil, err
		}
	}
	b, err := New(Config{
		Subscription: inst.Subscription, ResourceGroup: inst.ResourceGroup, Location: inst.Location, UID: inst.UID(),
		Credential: cred, Options: c.Options,
	})
	if err != nil {
		return nil, err
	}
	c.backing = b
	return b, nil
}

// Create implements csidriver.Backing.
func (c *ClusterBacking) Create(ctx context.Context, id string, bytes int64) (csidriver.Volume, error) {
	b, err := c.get(ctx)
	if err != nil {
		return csidriver.Volume{}, err
	}
	return b.Create(ctx, id, bytes)
}

// Get implements csidriver.Backing.
func (c *ClusterBacking) Get(ctx context.Context, id string) (csidriver.Volume, error) {
	b, err := c.get(ctx)
	if err != nil {
		return csidriver.Volume{}, err
	}
	return b.Get(ctx, id)
}

// Delete implements csidriver.Backing.
func (c *ClusterBacking) Delete(ctx context.Context, id string) error {
	b, err := c.get(ctx)
	if err != nil {
		return err
	}
	return b.Delete(ctx, id)
}

// Attach implements csidriver.Backing.
func (c *ClusterBacking) Attach(ctx context.Context, id, node string) error {
	b, err := c.get(ctx)
	if err != nil {
		return err
	}
	return b.Attach(ctx, id, node)
}

// Detach implements csidriver.Backing.
func (c *ClusterBacking) Detach(ctx context.Context, id, node string) error {
	b, err := c.get(ctx)
	if err != nil {
		return err
	}
	return b.Detach(ctx, id, node)
}

// Expand implements csidriver.Backing.
func (c *ClusterBacking) Expand(ctx context.Context, id string, bytes int64) (int64, error) {
	b, err := c.get(ctx)
	if err != nil {
		return 0, err
	}
	return b.Expand(ctx, id, bytes)
}
