// Package platform is the local provider as the CLI meets it (provider.Platform): it checks a
// configuration against the sandboxes' fixed networks, measures node image directories,
// creates a cluster (its AK CA, init secret and provider process, internal/provider/local/
// cluster) in the workspace's folder mini, and opens and removes it again. The provider
// catalog registers it (internal/provider/catalog).
package platform

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
)

// Name is the local provider's name: the key of its configuration block and the state file's
// provider (state.ProviderLocal, which the catalog's test holds equal to it).
const Name = "local"

// Folder is the folder below the workspace that holds a local cluster: its spec, status,
// nodes, keys and the provider's log (docs/local-provider.md).
const Folder = "mini"

// Files of a cluster in Folder that Create writes.
const (
	akCAKeyFile    = "ak-ca-key.pem"
	initSecretFile = "init-secret"
)

// Platform is the local provider.
type Platform struct{}

var (
	_ provider.Platform            = Platform{}
	_ provider.NodeImages          = Platform{}
	_ provider.Daemon              = Platform{}
	_ provider.ImageLoader         = Platform{}
	_ provider.ServiceLoadBalancer = Platform{}
)

// ServiceLBKubeconfig implements provider.ServiceLoadBalancer.
func (p Platform) ServiceLBKubeconfig(workspace string) string {
	return filepath.Join(p.Folder(workspace), cluster.ServiceLBKubeconfigFile)
}

// LoadedImagesDir implements provider.ImageLoader.
func (p Platform) LoadedImagesDir(workspace string) string {
	return filepath.Join(p.Folder(workspace), cluster.LoadedImagesDir)
}

// LoadImages implements provider.ImageLoader through the running provider's API.
func (p Platform) LoadImages(ctx context.Context, workspace string, archives []string) ([]provider.ImageLoad, error) {
	prov, err := p.Open(workspace)
	if err != nil {
		return nil, err
	}
	return prov.(*cluster.Local).LoadImages(ctx, archives)
}

// Name implements provider.Platform.
func (Platform) Name() string { return Name }

// ConfigRules implements provider.Platform.
func (Platform) ConfigRules() config.ProviderRules { return local.ConfigRules{} }

// Folder implements provider.Platform.
func (Platform) Folder(workspace string) string { return filepath.Join(workspace, Folder) }

// ReferenceValues implements provider.Platform: image is a node image directory, each file
// measured into its PCR as the provider does at boot (docs/attestation.md).
func (Platform) ReferenceValues(image string) (provider.ReferenceValues, error) {
	components, err := local.ImageComponents(image)
	if err != nil {
		return provider.ReferenceValues{}, err
	}
	rv := provider.ReferenceValues{Measurements: softfirmware.ExpectedPCRs(components), Components: map[uint32][]string{}}
	for _, c := range components {
		rv.Components[uint32(c.PCR)] = append(rv.Components[uint32(c.PCR)], c.Name)
	}
	return rv, nil
}

// Open implements provider.Platform.
func (p Platform) Open(workspace string) (provider.Provider, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return &cluster.Local{Dir: p.Folder(workspace), Exe: exe}, nil
}

// InitSecret implements provider.Platform.
func (p Platform) InitSecret(workspace string) ([]byte, error) {
	secret, err := os.ReadFile(filepath.Join(p.Folder(workspace), initSecretFile))
	if err != nil {
		return nil, fmt.Errorf("the init secret of the local cluster: %w", err)
	}
	return secret, nil
}

// Remove implements provider.Platform. The cluster's folder alone says what to remove (a
// state file may be missing: create failed half-way).
func (p Platform) Remove(ctx context.Context, workspace string) (int, error) {
	dir := p.Folder(workspace)
	l, err := p.Open(workspace)
	if err != nil {
		return 0, err
	}
	nodes := 0
	if spec, err := cluster.ReadSpec(dir); err == nil {
		nodes = len(spec.Nodes)
	}
	if err := l.Destroy(ctx); err != nil {
		return 0, fmt.Errorf("removing the cluster: %w", err)
	}
	return nodes, os.RemoveAll(dir)
}

// Create implements provider.Platform: the cluster's AK CA and init secret in the cluster's
// folder, then its provider process, which boots every node.
func (p Platform) Create(ctx context.Context, req provider.CreateRequest) (provider.Provider, error) {
	return CreateOn(ctx, req, Machines{Provider: Name, Images: checkImages})
}

// Machines are the machines a provider built on this one (its provider process, network and
// services: internal/provider/qemu) creates its cluster's nodes on.
type Machines struct {
	// Provider is the provider's name (its configuration block).
	Provider string
	// Kind and Shape are the machines' kind and configuration (cluster.RegisterMachines);
	// an empty Kind is sandboxes.
	Kind  string
	Shape any
	// Images checks the request's node images and returns the folder of the container images
	// the nodes import ("" when the node images carry them).
	Images func(provider.CreateRequest) (string, error)
}

// CreateOn creates a cluster in the workspace's folder on machines m: its AK CA and init
// secret, then its provider process, which boots every node.
func CreateOn(ctx context.Context, req provider.CreateRequest, m Machines) (provider.Provider, error) {
	if err := checkCreate(req.Config, m.Provider); err != nil {
		return nil, err
	}
	dir := Platform{}.Folder(req.Workspace)
	if _, err := cluster.ReadSpec(dir); err == nil {
		return nil, fmt.Errorf("%s has a local cluster: remove it with 'constellation terminate' or 'constellation mini down'", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	imagesDir, err := m.Images(req)
	if err != nil {
		return nil, err
	}
	spec := cluster.Spec{Dir: dir, ImagesDir: imagesDir, Machines: m.Kind}
	if m.Kind != "" {
		if spec.MachineShape, err = json.Marshal(m.Shape); err != nil {
			return nil, err
		}
	}
	if req.Config.Network.NAT() {
		spec.NAT = &cluster.NATSpec{HostLoopback: req.Config.Network.HostLoopback}
	}
	if spec.AKCACert, spec.AKCAKey, err = WriteAKCA(dir); err != nil {
		return nil, err
	}
	if spec.InitSecretHash, err = writeInitSecret(dir); err != nil {
		return nil, err
	}
	for _, n := range req.Nodes {
		spec.Nodes = append(spec.Nodes, cluster.NodeSpec{NodeSpec: n})
	}
	if req.UnexpectedWorkerBootstrapper != "" {
		other, err := unexpectedWorker(dir, req)
		if err != nil {
			return nil, err
		}
		spec.Nodes = append(spec.Nodes, cluster.NodeSpec{NodeSpec: other})
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return cluster.Launch(ctx, exe, spec)
}

// checkImages checks, before any node exists, that the node image of every node runs the
// configuration's Kubernetes version and that the container images of it are in the index of
// req.ImagesDir, and returns that directory's absolute path.
func checkImages(req provider.CreateRequest) (string, error) {
	imagesDir, err := filepath.Abs(req.ImagesDir)
	if err != nil {
		return "", err
	}
	if _, err := nodeimage.ReadIndex(imagesDir); err != nil {
		return "", fmt.Errorf("reading the node's container images (run 'make images' first): %w", err)
	}
	for _, n := range req.Nodes {
		data, err := os.ReadFile(filepath.Join(n.Image, local.NodeConfigFile))
		if err != nil {
			return "", fmt.Errorf("node image of %s: %w", n.Name, err)
		}
		nodeConfig, err := local.ParseNodeConfig(data)
		if err != nil {
			return "", fmt.Errorf("node image %s: %w", n.Image, err)
		}
		if want := req.Config.KubernetesVersion; nodeConfig.KubernetesVersion != want {
			return "", fmt.Errorf("node image %s runs Kubernetes %s, but %s says kubernetesVersion %s: lay out an image of %s",
				n.Image, nodeConfig.KubernetesVersion, config.FileName, want, want)
		}
		if _, err := cluster.NodeImages(imagesDir, n.Image, n.Role, n.KubernetesVersions...); err != nil {
			return "", err
		}
	}
	return imagesDir, nil
}

// checkCreate checks what the local provider requires of a configuration beyond its rules:
// its block, its nodes' variant, and the sandbox network's fixed ranges
// (docs/local-provider.md).
func checkCreate(conf *config.Config, name string) error {
	if got := conf.Provider.Name(); got != name {
		if got == "" {
			return fmt.Errorf("%s: provider.%s: missing", config.FileName, name)
		}
		return fmt.Errorf("%s: provider: the configuration is for provider %s, not %s", config.FileName, got, name)
	}
	if v := conf.Attestation.Variant(); v != local.Variant {
		return fmt.Errorf("%s: attestation: the %s provider's nodes attest with %s (attestation.%s)", config.FileName, name, local.Variant, local.Variant.ConfigKey())
	}
	if conf.Network.PodCIDR != sandbox.PodCIDR.String() || conf.Network.ServiceCIDR != sandbox.ServiceCIDR.String() {
		return fmt.Errorf("%s: network: the %s provider uses podCIDR %s and serviceCIDR %s (got %s and %s)",
			config.FileName, name, sandbox.PodCIDR, sandbox.ServiceCIDR, conf.Network.PodCIDR, conf.Network.ServiceCIDR)
	}
	return nil
}

// WriteAKCA creates the cluster's AK CA, which certifies its nodes' attestation keys, and
// returns the paths of its certificate and key. Key material goes through fileutil: a 0600
// temporary file created exclusively, so a leftover or planted file at any name neither
// redirects the key nor lends it its mode.
func WriteAKCA(dir string) (certPath, keyPath string, err error) {
	ca, err := akca.New("constellation local AK CA", time.Now(), 365*24*time.Hour)
	if err != nil {
		return "", "", err
	}
	caCert, caKey, err := ca.PEM()
	if err != nil {
		return "", "", err
	}
	certPath, keyPath = filepath.Join(dir, cluster.AKCAFile), filepath.Join(dir, akCAKeyFile)
	if err := fileutil.WriteAtomic(certPath, caCert, 0o644); err != nil {
		return "", "", err
	}
	if err := fileutil.WriteAtomic(keyPath, caKey, 0o600); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

// writeInitSecret creates the init secret, which gates who may initialize, and returns its
// bcrypt hash: the provider publishes only the hash to its nodes.
func writeInitSecret(dir string) (string, error) {
	initSecret := make([]byte, 32)
	if _, err := rand.Read(initSecret); err != nil {
		return "", err
	}
	if err := fileutil.WriteAtomic(filepath.Join(dir, initSecretFile), initSecret, 0o600); err != nil {
		return "", err
	}
	hash, err := bcrypt.GenerateFromPassword(initSecret, bcrypt.DefaultCost)
	if err != nil {
		return "", err
	}
	return string(hash), nil
}

// unexpectedWorker lays out the image of the request's unexpected worker (the first node's
// image with another bootstrapper) and returns the worker.
func unexpectedWorker(dir string, req provider.CreateRequest) (provider.NodeSpec, error) {
	if len(req.Nodes) == 0 {
		return provider.NodeSpec{}, errors.New("an unexpected worker needs a node image to differ from")
	}
	data, err := os.ReadFile(filepath.Join(req.Nodes[0].Image, local.NodeConfigFile))
	if err != nil {
		return provider.NodeSpec{}, err
	}
	nodeConfig, err := local.ParseNodeConfig(data)
	if err != nil {
		return provider.NodeSpec{}, err
	}
	other := filepath.Join(dir, "image-other")
	kubeBin := filepath.Join(req.KubeDir, nodeConfig.KubernetesVersion, "bin")
	if err := buildNodeImage(other, req.UnexpectedWorkerBootstrapper, kubeBin, nodeConfig); err != nil {
		return provider.NodeSpec{}, err
	}
	return provider.NodeSpec{Name: "worker-other", Role: metadata.Worker, Image: other, Unexpected: true}, nil
}

// Serve implements provider.Daemon: args are the path of the cluster's spec, and the
// provider runs it until ctx ends, logging JSON to stderr.
func (Platform) Serve(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want the path of a cluster spec, got %d arguments", len(args))
	}
	data, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	// encoding/json, not strictjson: the spec is this program's own output (cluster.Create
	// writes it into the cluster's folder for this daemon).
	var spec cluster.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("reading %s: %w", args[0], err)
	}
	return cluster.Serve(ctx, spec, slog.New(slog.NewJSONHandler(os.Stderr, nil)))
}
