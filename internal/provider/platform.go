package provider

import (
	"context"
	"io/fs"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Platform is a kind of platform (local sandboxes; a cloud) as the CLI meets it before a
// cluster exists and around its life: what it requires of a configuration, what a node image
// of it must measure, how it creates a cluster's nodes and hands out the init secret, and how
// to reach and remove a cluster it created. Provider is one running cluster of it.
//
// Implementations live in their provider's folder and are registered by one line in the
// provider catalog (internal/provider/catalog), which the CLI looks up by the configuration's
// (and the state file's) provider name. docs/providers.md lists what each method must do.
type Platform interface {
	// Name is the provider's name: the key of its configuration block (provider.<name>) and
	// the provider the state file records.
	Name() string
	// ConfigRules are its checks of a configuration; the catalog registers them with
	// internal/config, whose Validate applies them.
	ConfigRules() config.ProviderRules
	// ReferenceValues measures a node image (a path the platform understands) offline: the
	// registers a node booting it must show.
	ReferenceValues(image string) (ReferenceValues, error)
	// Create creates the nodes of a new cluster and returns it once the platform started
	// them (their bootstrappers run), not when they joined. It generates the cluster's init
	// secret (InitSecret) and gives its nodes only its hash.
	Create(ctx context.Context, req CreateRequest) (Provider, error)
	// Open returns the cluster the platform runs for workspace (it may be stopped).
	Open(workspace string) (Provider, error)
	// InitSecret returns the init secret Create generated for the cluster of workspace: the
	// CLI sends it with the init request, and a node accepts that request only if the secret
	// matches the hash its platform published.
	InitSecret(workspace string) ([]byte, error)
	// Remove removes the cluster of workspace, if any: every node, disk, process and network,
	// and every file the platform keeps in the workspace. It returns how many nodes the
	// cluster had. A workspace without a cluster of this platform is not an error.
	Remove(ctx context.Context, workspace string) (nodes int, err error)
	// Folder is where the platform keeps a cluster's files below workspace (local:
	// workspace/mini), for messages and for files the CLI keeps with the cluster; "" if the
	// platform keeps none there.
	Folder(workspace string) string
}

// CreateRequest is a cluster to create.
type CreateRequest struct {
	// Workspace holds the cluster's configuration and state.
	Workspace string
	// Config is the validated configuration.
	Config *config.Config
	// Nodes are the nodes to create, in order; the first control plane is initialized.
	Nodes []NodeSpec
	// ImagesDir holds the container images every node imports (make images).
	ImagesDir string
	// UnexpectedWorkerBootstrapper, when set, adds a worker "worker-other" whose image differs
	// from Nodes' in its bootstrapper (this binary); KubeDir (<KubeDir>/<version>/bin)
	// provides the rest of its image.
	// For tests: a node the join service must refuse. A platform that cannot boot another
	// image refuses the request.
	UnexpectedWorkerBootstrapper, KubeDir string
}

// ReferenceValues are what a node image measures.
type ReferenceValues struct {
	// Measurements are the registers a node booting the image shows (registers the image
	// does not measure read their reset value).
	Measurements measurements.M
	// Components name what each register measures, for messages: register -> names.
	Components map[uint32][]string
	// Variant is the variant the values are for, when the platform's records say (a cloud's
	// firmware record); zero: the platform's default (its rules' first variant).
	Variant variant.Variant
	// Hardware is the variant's hardware reference the platform's records give, if any.
	Hardware choose.HardwareValues
}

// FirmwareRecorded is implemented by a Platform whose reference values include firmware
// registers observed once per firmware build (the QEMU provider: internal/measuredboot):
// WithFirmwareRecord returns the platform that also knows raw, a record the user made on
// their host for a firmware build or machine shape the built-in records do not cover
// (`config generate qemu --firmware-record`).
type FirmwareRecorded interface {
	WithFirmwareRecord(raw []byte) (Platform, error)
}

// NodeImages is implemented by a Platform whose node images the CLI lays out itself (the
// local provider: a directory of files): `config generate` and `mini up` build the default
// image with it.
type NodeImages interface {
	// ImageFiles names the files of a node image, for help texts.
	ImageFiles() []string
	// LayOutDefaultImage writes the default node image of a Kubernetes version to dir: the
	// bootstrapper next to the CLI, the version's Kubernetes node binaries from kubeDir
	// (<kubeDir>/<version>/bin) and the services image named in the container image index of
	// imagesDir, which must hold the version's images.
	LayOutDefaultImage(dir, kubernetesVersion, kubeDir, imagesDir string) error
	// ImageDigest is the digest of a node image as a release signs it (docs/releases.md): the
	// SHA-256 of its ImageListing.
	ImageDigest(dir string) (string, error)
	// ImageListing is the sha256sum(1) listing of the files of a node image (paths relative to
	// it) that its digest covers; a release source serves it beside the image.
	ImageListing(dir string) ([]byte, error)
	// LayOutReleaseImage writes to dir the node image of a release: base's, stamped with the
	// release's version, so that it measures differently from every other release's, trusting
	// the join services of the images r.JoinServiceSets describe besides its own (the
	// releases it upgrades from), and carrying the release's services image. It returns what
	// the image runs.
	LayOutReleaseImage(dir, base string, r ReleaseImage) (ImageFacts, error)
	// ReadImageFacts reads what a node image says about itself (the local provider: its
	// node-config.json) from image, the image's files: a directory (os.DirFS), or a release
	// source's, each file checked against the release's signed listing as it is read
	// (releasesource.Client.ImageFiles). The CLI compares it with the release before an
	// upgrade: which join services the image's nodes trust, and that the image is the
	// release's.
	ReadImageFacts(image fs.FS) (ImageFacts, error)
}

// ReleaseImage is what makes a node image a release's.
type ReleaseImage struct {
	// Version is the release's.
	Version string
	// JoinServiceSets describe the images whose join services the release's nodes trust
	// besides their own.
	JoinServiceSets measurements.ReferenceSets
	// ServicesRef and ServicesArchive are the release's services image and its archive: the
	// image carries the archive (its nodes import it) and names the ref as the services its
	// control planes deploy.
	ServicesRef, ServicesArchive string
	// UpgradesFrom are the node images of the releases it upgrades from: its image carries
	// their services images too, which its first nodes run until the upgrade rolls the
	// services to the release's own.
	UpgradesFrom []string
}

// ImageFacts are what a node image runs, as a release states them.
type ImageFacts struct {
	// KubernetesVersion is the Kubernetes version its nodes run ("v1.34.4").
	KubernetesVersion string
	// ServicesImage is the reference of the in-cluster services image its control planes
	// deploy.
	ServicesImage string
	// Release is the version of the release the image was laid out for; empty for an image
	// that is not a release's. (ReadImageFacts only.)
	Release string
	// JoinServiceSets describe the images whose join services the image's nodes trust
	// besides their own (ReleaseImage.JoinServiceSets). (ReadImageFacts only.)
	JoinServiceSets measurements.ReferenceSets
}

// PowerCutter is implemented by a Provider that can cut a node's power, or the whole
// cluster's and its own, at one instant (tests of what a power loss does).
type PowerCutter interface {
	PowerCutNode(ctx context.Context, name string) error
	PowerCut(ctx context.Context) error
}

// NodeShutdowner is implemented by a Provider that can shut a node down gracefully and keep
// it off, with its disk, as a machine's orderly shutdown does (its API server and etcd stop
// cleanly, the platform's API load balancer sends it no new connections from the start).
// Scaling down shuts a control plane down this way before its etcd member is removed, so
// its API server never answers without its etcd (docs/scaling.md). RebootNode boots it again.
// A node that is off already is no error; one that does not exist wraps ErrNoNode.
type NodeShutdowner interface {
	ShutdownNode(ctx context.Context, name string) error
}

// APIServerStopper is implemented by a Provider that can stop a leaving control plane's API
// server alone, gracefully (the API load balancer sends it no new connections, it finishes
// its requests and tells its clients to go elsewhere), while its etcd keeps running. A
// control plane whose etcd member cannot be missed while it is down (two members: removing
// one needs both) stops its API server this way before its member is removed, so no client
// meets an API server without its etcd (docs/scaling.md). The node is leaving: it is deleted
// next. A node that is off already is no error; one that does not exist wraps ErrNoNode.
type APIServerStopper interface {
	StopAPIServer(ctx context.Context, name string) error
}

// Paced is implemented by a Platform whose nodes can be much slower than the commands'
// default timeouts assume (machines under emulation): a command given no --timeout waits its
// default times TimeoutFactor of the workspace's cluster (1 or less: the default).
type Paced interface {
	TimeoutFactor(workspace string) int
}

// ImageLoader is implemented by a Platform whose nodes cannot get the user's images by
// themselves (the local provider: images the user built have no registry): `constellation
// image load` stores archives in the cluster's LoadedImagesDir, which every node imports at
// every boot, and LoadImages imports them into the running nodes now.
type ImageLoader interface {
	LoadedImagesDir(workspace string) string
	// LoadImages imports the named archives of LoadedImagesDir into every running node; a
	// node that is off imports them when it boots (ImageLoad.Deferred).
	LoadImages(ctx context.Context, workspace string, archives []string) ([]ImageLoad, error)
}

// ImageLoad is the outcome of loading images into one node.
type ImageLoad struct {
	Node string `json:"node"`
	// Deferred: the node is off; it imports the images when it boots.
	Deferred bool   `json:"deferred,omitempty"`
	Error    string `json:"error,omitempty"`
}

// ServiceLoadBalancer is implemented by a Platform that makes the cluster's NodePort and
// LoadBalancer Services reachable from outside (the local provider: ports on the host's
// loopback), as a cloud's load balancer controller does. It acts on the cluster with the
// kubeconfig the CLI writes to ServiceLBKubeconfig, which may only read Services and write
// their status.
type ServiceLoadBalancer interface {
	ServiceLBKubeconfig(workspace string) string
}

// Daemon is implemented by a Platform that runs a long-lived process of its own on the CLI's
// host (the local provider's process, which owns the nodes): the CLI binary runs it when the
// platform starts itself, through the hidden command `mini provider ARGS`.
type Daemon interface {
	Serve(ctx context.Context, args []string) error
}

// Maturity is implemented by a Platform that was not run against the real thing it drives
// (a cloud no account was available for): Maturity says how it was verified, and
// `constellation version` prints it with the provider's name.
type Maturity interface {
	Maturity() string
}

// ImageUploader is implemented by a Platform whose nodes boot a node OS image stored in the
// platform (a cloud's image gallery): `constellation image upload <provider>` stores one
// there and prints the reference a configuration's image takes.
type ImageUploader interface {
	// UploadImage stores the node OS image of req, idempotently: a rerun finds the image it
	// stored; another image under the same version is refused.
	UploadImage(ctx context.Context, req ImageUploadRequest) (ref string, err error)
}

// ImageUploadRequest is a node OS image to store in a platform.
type ImageUploadRequest struct {
	// Image is the node OS image folder (make vm-image).
	Image string
	// Version names the stored image ("1.2.3").
	Version string
	// Settings say where to store it: the platform's own keys (Azure: subscriptionID,
	// resourceGroup, location, gallery, definition), each refused unless known.
	Settings map[string]string
}
