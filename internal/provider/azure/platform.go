package azure

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/google/uuid"
	"golang.org/x/crypto/bcrypt"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Name is the Azure provider's name: its configuration block and the state file's provider.
const Name = "azure"

// Folder is the folder below the workspace that holds what the CLI keeps of an Azure cluster:
// its record (which resources are its) and its init secret. Never a credential.
const Folder = "azure"

// Files of Folder.
const (
	recordFile     = "cluster.json"
	initSecretFile = "init-secret"
)

// Platform is the Azure provider as the CLI meets it.
type Platform struct {
	// Credential and Transport replace Azure's credential chain and the network (tests: the
	// simulated cloud, azuresim). Nil: azidentity.DefaultAzureCredential (environment,
	// workload identity, managed identity, Azure CLI) over HTTPS.
	Credential azcore.TokenCredential
	Transport  policy.Transporter
	// PollEvery is how often long-running operations are polled; zero: every 3 s (Azure's
	// Retry-After, when longer, wins). Tests on the simulated cloud poll at once.
	PollEvery time.Duration

	// firmware is the firmware record ReferenceValues uses (WithFirmwareRecord).
	firmware *FirmwareRecord
	// tune, if set, adjusts the clients (tests: poll and retry without waiting).
	tune func(*clients)
}

var (
	_ provider.Platform         = Platform{}
	_ provider.Maturity         = Platform{}
	_ provider.ImageUploader    = Platform{}
	_ provider.FirmwareRecorded = Platform{}
)

// Maturity implements provider.Maturity, until a live run is recorded (docs/azure.md
// "Status").
func (Platform) Maturity() string {
	return "verified against the SDK's fakes and a simulated cloud; never run against Azure by this project"
}

// Name implements provider.Platform.
func (Platform) Name() string { return Name }

// ConfigRules implements provider.Platform.
func (Platform) ConfigRules() config.ProviderRules { return ConfigRules{} }

// Folder implements provider.Platform.
func (Platform) Folder(workspace string) string { return filepath.Join(workspace, Folder) }

// record is what the CLI keeps of a cluster: where its resources are and how they are named.
type record struct {
	Layout   layout          `json:"layout"`
	Settings Settings        `json:"settings"`
	Variant  variant.Variant `json:"variant"`
	// Image is the resource ID of the gallery image version new nodes boot.
	Image string `json:"image"`
	// InitSecretHash is the bcrypt hash of the init secret that control planes carry.
	InitSecretHash string `json:"initSecretHash"`
	// PodNetwork is the cluster's pod network, a /24 of it per node (podNetwork).
	PodNetwork netip.Prefix `json:"podNetwork"`
}

func (p Platform) readRecord(workspace string) (record, error) {
	raw, err := os.ReadFile(filepath.Join(p.Folder(workspace), recordFile))
	if err != nil {
		return record{}, fmt.Errorf("the Azure cluster's record: %w", err)
	}
	var r record
	if err := json.Unmarshal(raw, &r); err != nil {
		return record{}, fmt.Errorf("the Azure cluster's record %s: %w", filepath.Join(p.Folder(workspace), recordFile), err)
	}
	return r, nil
}

// credential is the credential of the platform's calls.
func (p Platform) credential() (azcore.TokenCredential, error) {
	if p.Credential != nil {
		return p.Credential, nil
	}
	cred, err := azidentity.NewDefaultAzureCredential(nil)
	if err != nil {
		return nil, explain("find Azure credentials", err)
	}
	return cred, nil
}

func (p Platform) clients(r record) (*clients, error) {
	cred, err := p.credential()
	if err != nil {
		return nil, err
	}
	c, err := newClients(r.Layout.Subscription, cred, ClientOptions(p.Transport))
	if err != nil {
		return nil, err
	}
	p.adjust(c)
	return c, nil
}

// adjust applies the platform's polling and the tests' tuning to c.
func (p Platform) adjust(c *clients) {
	if p.PollEvery > 0 {
		c.pollEvery = p.PollEvery
	}
	if p.tune != nil {
		p.tune(c)
	}
}

// Open implements provider.Platform.
func (p Platform) Open(workspace string) (provider.Provider, error) {
	r, err := p.readRecord(workspace)
	if err != nil {
		return nil, err
	}
	c, err := p.clients(r)
	if err != nil {
		return nil, err
	}
	return newCluster(c, r), nil
}

// InitSecret implements provider.Platform.
func (p Platform) InitSecret(workspace string) ([]byte, error) {
	secret, err := os.ReadFile(filepath.Join(p.Folder(workspace), initSecretFile))
	if err != nil {
		return nil, fmt.Errorf("the init secret of the Azure cluster: %w", err)
	}
	return secret, nil
}

// imageIDRE is a gallery image version's resource ID (or an image definition's: its latest
// version).
var imageIDRE = regexp.MustCompile(`(?i)^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/galleries/[^/]+/images/[^/]+(/versions/[^/]+)?$`)

// checkImage refuses what is no gallery image version to boot: a configuration's image, or
// the one a release names for Azure.
func checkImage(image string) error {
	if !imageIDRE.MatchString(image) {
		return fmt.Errorf("provider.azure.image: %q is not a gallery image version's resource ID (constellation image upload azure prints it; or a release's directory or URL)", image)
	}
	return nil
}

// Create implements provider.Platform: the cluster's record and init secret in the
// workspace's folder first (so that a killed run's rerun, and terminate, find what it
// created), then its resources and nodes.
func (p Platform) Create(ctx context.Context, req provider.CreateRequest) (provider.Provider, error) {
	conf := req.Config
	if conf.Provider.Name() != Name {
		return nil, fmt.Errorf("the configuration is for provider %q, not %s", conf.Provider.Name(), Name)
	}
	if req.UnexpectedWorkerBootstrapper != "" {
		return nil, errors.New("the Azure provider cannot boot a node of another image (tests only)")
	}
	block := conf.Provider.Block()
	// The image the CLI resolved (a release's image on Azure: release.CloudImage), or the
	// configured one.
	image := block.Image
	if len(req.Nodes) > 0 && req.Nodes[0].Image != "" {
		image = req.Nodes[0].Image
	}
	if err := checkImage(image); err != nil {
		return nil, err
	}
	settings, problems := ParseSettings(block.Settings)
	if len(problems) > 0 {
		return nil, fmt.Errorf("provider.azure.settings: %w", problems[0])
	}
	r, err := p.ensureRecord(req.Workspace, conf, settings, image)
	if err != nil {
		return nil, err
	}
	c, err := p.clients(r)
	if err != nil {
		return nil, err
	}
	cl := newCluster(c, r)
	if err := cl.ensureInfrastructure(ctx); err != nil {
		return nil, err
	}
	if _, err := cl.CreateNodes(ctx, req.Nodes); err != nil {
		return nil, err
	}
	return cl, nil
}

// ensureRecord writes the cluster's record and init secret, or reads them if a killed run
// wrote them already.
func (p Platform) ensureRecord(workspace string, conf *config.Config, s Settings, image string) (record, error) {
	dir := p.Folder(workspace)
	if r, err := p.readRecord(workspace); err == nil {
		if r.Layout.Cluster != conf.Name || r.Layout.ResourceGroup != s.ResourceGroup || r.Layout.Subscription != s.SubscriptionID {
			return record{}, fmt.Errorf("%s holds Azure cluster %s in resource group %s: remove it with 'constellation terminate' first", dir, r.Layout.Cluster, r.Layout.ResourceGroup)
		}
		return r, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return record{}, err
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return record{}, err
	}
	hash, err := bcrypt.GenerateFromPassword(secret, bcrypt.DefaultCost)
	if err != nil {
		return record{}, err
	}
	pods, err := netip.ParsePrefix(conf.Network.PodCIDR)
	if err != nil {
		return record{}, fmt.Errorf("network.podCIDR: %w", err)
	}
	r := record{
		Layout: layout{
			Subscription: s.SubscriptionID, ResourceGroup: s.ResourceGroup, Location: s.Location,
			Cluster: conf.Name, UID: uuid.NewString()[:8],
		},
		Settings: s, Variant: conf.Attestation.Variant(), Image: image,
		InitSecretHash: string(hash), PodNetwork: pods,
	}
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return record{}, err
	}
	if err := fileutil.WriteAtomic(filepath.Join(dir, initSecretFile), secret, 0o600); err != nil {
		return record{}, err
	}
	return r, fileutil.WriteAtomic(filepath.Join(dir, recordFile), raw, 0o600)
}

// Remove implements provider.Platform: every resource the cluster's record names, then the
// record. A workspace without one has no Azure cluster.
func (p Platform) Remove(ctx context.Context, workspace string) (int, error) {
	if _, err := os.Stat(filepath.Join(p.Folder(workspace), recordFile)); errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	prov, err := p.Open(workspace)
	if err != nil {
		return 0, err
	}
	nodes, err := prov.Nodes(ctx)
	if err != nil {
		return 0, err
	}
	if err := prov.Destroy(ctx); err != nil {
		return 0, err
	}
	return len(nodes), os.RemoveAll(p.Folder(workspace))
}
