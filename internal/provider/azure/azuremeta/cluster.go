package azuremeta

import (
	"context"
	"fmt"
	"regexp"
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
	// Credential replaces the VM's managed identity, Options Azure's public cloud (tests); the
	// managed identity's token requests go through Options' transport.
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
	inst, err := c.IMDS.ClusterInstance(ctx)
	if err != nil {
		return nil, err
	}
	cred := c.Credential
	if cred == nil {
		if cred, err = ManagedIdentity(inst, TagNodesIdentity, c.Options); err != nil {
			return nil, err
		}
	}
	l, err := NewLister(inst.Subscription, inst.ResourceGroup, inst.UID(), cred, c.Options)
	if err != nil {
		return nil, err
	}
	c.lister = l
	return l, nil
}

// identityName is what Azure allows as a user-assigned identity's name.
var identityName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{2,127}$`)

// ManagedIdentity is the credential of the VM's managed identity that the VM's tag names
// (TagNodesIdentity, TagVolumesIdentity): a control plane's VM carries two, and a token is
// asked for one by its resource ID. A VM without the tag carries the nodes' identity only
// (clusters made before the volumes' identity), which is asked for without an ID; a VM
// without the volumes' tag has no right to the volumes' disks. opts, when set, carries the
// transport the token requests take (tests); nil: IMDS.
func ManagedIdentity(inst Instance, tag string, opts *arm.ClientOptions) (azcore.TokenCredential, error) {
	var client azcore.ClientOptions
	if opts != nil {
		client = opts.ClientOptions
	}
	name, ok := inst.Tags[tag]
	if !ok && tag == TagNodesIdentity {
		cred, err := azidentity.NewManagedIdentityCredential(&azidentity.ManagedIdentityCredentialOptions{ClientOptions: client})
		if err != nil {
			return nil, fmt.Errorf("the VM's managed identity: %w", err)
		}
		return cred, nil
	}
	if !identityName.MatchString(name) || inst.Subscription == "" || inst.ResourceGroup == "" {
		return nil, fmt.Errorf("VM %s: tag %s=%q names no managed identity of its group", inst.Name, tag, name)
	}
	id := "/subscriptions/" + inst.Subscription + "/resourceGroups/" + inst.ResourceGroup +
		"/providers/Microsoft.ManagedIdentity/userAssignedIdentities/" + name
	cred, err := azidentity.NewManagedIdentityCredential(&azidentity.ManagedIdentityCredentialOptions{ClientOptions: client, ID: azidentity.ResourceID(id)})
	if err != nil {
		return nil, fmt.Errorf("the VM's managed identity %s: %w", name, err)
	}
	return cred, nil
}

// ClusterInstance asks IMDS about the VM, which must be a node of a cluster (tagged with its
// UID): where the cluster's services find their cluster.
func (c IMDS) ClusterInstance(ctx context.Context) (Instance, error) {
	inst, err := c.Instance(ctx)
	if err != nil {
		return Instance{}, err
	}
	if inst.UID() == "" {
		return Instance{}, fmt.Errorf("VM %s carries no %s tag: it is no node of a cluster", inst.Name, TagUID)
	}
	return inst, nil
}
