package azuremeta

import (
	"context"
	"fmt"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"

	"github.com/openconstellation/constellation/internal/metadata"
)

// ClusterLister lists the instances of the cluster the VM it runs on belongs to: the VM's
// subscription, group and cluster UID come from IMDS (once), the list from Resource Manager
// with the VM's managed identity (Lister). It is the join service's lister on Azure, and a
// node's for its join endpoints.
type ClusterLister struct {
	IMDS IMDS
	// Credential and Options replace the VM's managed identity and Azure's public cloud
	// (tests).
	Credential azcore.TokenCredential
	Options    *arm.ClientOptions

	mu     sync.Mutex
	lister *Lister
}

var _ metadata.Lister = (*ClusterLister)(nil)

// NewClusterLister returns the lister of the cluster of the VM whose IMDS is at imdsURL ("":
// IMDSURL). It contacts nothing until used.
func NewClusterLister(imdsURL string) *ClusterLister {
	if imdsURL == "" {
		imdsURL = IMDSURL
	}
	return &ClusterLister{IMDS: IMDS{BaseURL: imdsURL}}
}

// Instances implements metadata.Lister.
func (c *ClusterLister) Instances(ctx context.Context) ([]metadata.Instance, error) {
	l, err := c.get(ctx)
	if err != nil {
		return nil, err
	}
	return l.Instances(ctx)
}

func (c *ClusterLister) get(ctx context.Context) (*Lister, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lister != nil {
		return c.lister, nil
	}
	inst, err := c.IMDS.Instance(ctx)
	if err != nil {
		return nil, err
	}
	if inst.UID() == "" {
		return nil, fmt.Errorf("VM %s carries no %s tag: it is no node of a cluster", inst.Name, TagUID)
	}
	cred := c.Credential
	if cred == nil {
		// The VM's one user-assigned identity: the nodes' (the host half gives it no other).
		if cred, err = azidentity.NewManagedIdentityCredential(nil); err != nil {
			return nil, fmt.Errorf("the VM's managed identity: %w", err)
		}
	}
	l, err := NewLister(inst.Subscription, inst.ResourceGroup, inst.UID(), cred, c.Options)
	if err != nil {
		return nil, err
	}
	c.lister = l
	return l, nil
}
