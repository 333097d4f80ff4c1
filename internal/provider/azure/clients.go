package azure

import (
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/authorization/armauthorization/v2"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/msi/armmsi"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resources/armresources/v3"

	"github.com/openconstellation/constellation/internal/retry"
)

// clients are the Azure Resource Manager clients the provider calls, of one subscription.
type clients struct {
	groups          *armresources.ResourceGroupsClient
	resources       *armresources.Client
	vms             *armcompute.VirtualMachinesClient
	disks           *armcompute.DisksClient
	galleries       *armcompute.GalleriesClient
	images          *armcompute.GalleryImagesClient
	versions        *armcompute.GalleryImageVersionsClient
	vnets           *armnetwork.VirtualNetworksClient
	securityGroups  *armnetwork.SecurityGroupsClient
	publicIPs       *armnetwork.PublicIPAddressesClient
	loadBalancers   *armnetwork.LoadBalancersClient
	interfaces      *armnetwork.InterfacesClient
	routeTables     *armnetwork.RouteTablesClient
	identities      *armmsi.UserAssignedIdentitiesClient
	roleDefinitions *armauthorization.RoleDefinitionsClient
	roleAssignments *armauthorization.RoleAssignmentsClient

	// pollEvery is how often a long-running operation is polled (Azure's Retry-After, when
	// longer, wins).
	pollEvery time.Duration
	// retry is the back-off of call.
	retry retry.Policy
}

// Retries of the SDK's own pipeline: short waits only (a Retry-After longer than sdkMaxDelay
// comes back as the call's error, and the provider's own retry waits for it while it says so
// every 5 s: ensure.go).
const (
	sdkMaxRetries = 4
	sdkMaxDelay   = 4 * time.Second
	// defaultPollEvery is how often long-running operations are polled.
	defaultPollEvery = 3 * time.Second
)

// ClientOptions are the options of the provider's clients: Azure's public cloud, the SDK's
// retries with short waits, and a transport (tests: the SDK's fake servers).
func ClientOptions(transport policy.Transporter) *arm.ClientOptions {
	return &arm.ClientOptions{ClientOptions: azcore.ClientOptions{
		Transport: transport,
		Retry:     policy.RetryOptions{MaxRetries: sdkMaxRetries, RetryDelay: time.Second, MaxRetryDelay: sdkMaxDelay},
		Telemetry: policy.TelemetryOptions{ApplicationID: "constellation"},
	}}
}

// newClients makes the clients of subscription with cred and opts (ClientOptions).
func newClients(subscription string, cred azcore.TokenCredential, opts *arm.ClientOptions) (*clients, error) {
	if subscription == "" {
		return nil, fmt.Errorf("no Azure subscription")
	}
	resources, err := armresources.NewClientFactory(subscription, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the Azure resource clients: %w", err)
	}
	compute, err := armcompute.NewClientFactory(subscription, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the Azure compute clients: %w", err)
	}
	network, err := armnetwork.NewClientFactory(subscription, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the Azure network clients: %w", err)
	}
	msi, err := armmsi.NewClientFactory(subscription, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the Azure identity clients: %w", err)
	}
	authz, err := armauthorization.NewClientFactory(subscription, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the Azure authorization clients: %w", err)
	}
	return &clients{
		groups: resources.NewResourceGroupsClient(), resources: resources.NewClient(),
		vms: compute.NewVirtualMachinesClient(), disks: compute.NewDisksClient(),
		galleries: compute.NewGalleriesClient(), images: compute.NewGalleryImagesClient(), versions: compute.NewGalleryImageVersionsClient(),
		vnets: network.NewVirtualNetworksClient(), securityGroups: network.NewSecurityGroupsClient(),
		publicIPs: network.NewPublicIPAddressesClient(), loadBalancers: network.NewLoadBalancersClient(),
		interfaces: network.NewInterfacesClient(), routeTables: network.NewRouteTablesClient(),
		identities:      msi.NewUserAssignedIdentitiesClient(),
		roleDefinitions: authz.NewRoleDefinitionsClient(), roleAssignments: authz.NewRoleAssignmentsClient(),
		pollEvery: defaultPollEvery, retry: retryPolicy,
	}, nil
}
