package boot

import (
	"context"
	"log/slog"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Platform is what the node program needs of the machine it runs on: the node half of a
// provider (the sandbox's internal/provider/local/nodeboot; a VM's or a cloud's own). It runs
// on the node, unlike provider.Platform, which runs on the operator's machine: everything it
// says reaches the cluster only through the node's attestation, so it is trusted for
// availability only, as the platform is.
type Platform interface {
	// Name is the platform's name in the provider catalog: the services' --platform.
	Name() string
	// Metadata is the platform's metadata service as this node sees it: who the node is,
	// where the join service may be, the init-secret hash; and where the node reports its
	// phases.
	Metadata(ctx context.Context) (Metadata, error)
	// Attestation is the node's attestation variant and its issuer's environment: the one
	// place a node platform builds a choose.IssuerEnv (its TPM, its event log, its CPU's
	// quote devices). The environment's TPM opener is also the node's lock (its variant's
	// cluster-ID register) and the root of its check of the join service.
	Attestation() (variant.Variant, choose.IssuerEnv)
	// NodeConfig is the node image's measured configuration.
	NodeConfig() (NodeConfig, error)
	// Storage is the node's state storage, locked (a gocryptfs folder, a LUKS2 disk).
	Storage() (statedisk.Storage, error)
	// OS boots the node's operating-system side for the node self: container runtime and
	// images, the kubelet's supervisor, the pod network.
	OS(ctx context.Context, self metadata.Instance) (OS, error)
	// Volumes are the node half of the encrypted volume driver: how the node finds a volume
	// attached to it, and how it opens one with its key.
	Volumes() (csidriver.Devices, csidriver.Unlocker, error)
	// Services are the facts the in-cluster services need of the platform (deploy).
	Services() deploy.PlatformFacts
}

// PlatformConfig are the bootstrapper's flags a node platform may use: the node's folder
// (a sandbox's workspace), the node image's folder and container image archives, and the
// platform's metadata service ("" for the platform's default).
type PlatformConfig struct {
	NodeDir  string
	ImageDir string
	Images   []string
	// ImageStores are folders of further archives, listed once containerd is up.
	ImageStores []string
	MetadataURL string
	Log         *slog.Logger
}

// Metadata is a platform's metadata service as a node uses it.
type Metadata interface {
	metadata.Provider
	metadata.Reporter
}

// NodeConfig is what the node image fixes for the node program, measured with the image.
type NodeConfig struct {
	// KubernetesVersion is the only Kubernetes version the image runs, "v1.X.Y".
	KubernetesVersion string
	// ServicesImage is the image of the in-cluster services a first control plane deploys.
	ServicesImage string
	// JoinServiceSets are the images, besides its own, whose join services the node trusts
	// (joinservice.ServiceCheck).
	JoinServiceSets measurements.ReferenceSets
}

// OS is the node's operating system as the node program drives it.
type OS interface {
	// NodeSettings are what the OS fixes for kubeadm: the CRI socket, where control-plane
	// images come from, and whether the node is a local sandbox.
	NodeSettings() kubeadmconfig.NodeSettings
	// Kubeadm is the path of the image's kubeadm binary.
	Kubeadm() string
	// Kubelet is the kubelet's supervisor; it starts nothing until Start.
	Kubelet() Kubelet
	// WaitImages waits until the image's container images are imported.
	WaitImages(ctx context.Context) error
	// MountState makes the node's state (kubelet, etcd, kubernetes folders) persistent on the
	// unlocked state storage; called once, right after the unlock.
	MountState() error
	// Logs are the node's other logs (kubelet, containerd) for init's log collection.
	Logs(ctx context.Context) []byte
}

// Kubelet supervises the node's kubelet.
type Kubelet interface {
	// Start starts the kubelet and restarts it when it exits, until ctx ends.
	Start(ctx context.Context)
	// Restart restarts the kubelet with the configuration on the node.
	Restart(ctx context.Context) error
	// ExitIsFatal makes a later kubelet exit the node's failure (Failed) instead of a restart.
	ExitIsFatal()
	// Failed carries why the kubelet failed, after ExitIsFatal.
	Failed() <-chan error
}
