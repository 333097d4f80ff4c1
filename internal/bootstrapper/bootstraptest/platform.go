package bootstraptest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// PlatformName is the test platform's name (its services' --platform).
const PlatformName = "bootstraptest"

// Platform is a node platform inside the test process (boot.Platform), so the real node
// program (boot.Run) runs without a sandbox: the node's TPM is a measured, certified swtpm
// opened per use, its state storage a gocryptfs folder, its metadata a metadata.Static that
// records the node's phase reports, and its OS a stand-in that boots nothing (the kubelet is
// counted, kubeadm is never run before the node is in a cluster).
type Platform struct {
	Node   *Node
	Meta   *metadata.Static
	State  *statedisk.Gocryptfs
	NodeOS *OS

	mu      sync.Mutex
	reports []string
}

// NewPlatform boots a node named by meta's instance on a fresh swtpm as the local provider
// does (measured from opts.Image, AKs certified by ca unless opts.Uncertified) and returns its
// platform; nothing of the node is opened yet: boot.Run opens it. It is torn down when t ends.
func NewPlatform(t testing.TB, meta *metadata.Static, ca *akca.CA, opts NodeOptions) *Platform {
	t.Helper()
	n := bootNode(t, meta.Instance.Name, ca, opts)
	// The node program opens the TPM per use, and a swtpm serves one connection at a time.
	require.NoError(t, n.TPM.Close())
	n.TPM = nil
	p := &Platform{
		Node: n, Meta: meta, NodeOS: &OS{},
		State: &statedisk.Gocryptfs{Dir: filepath.Join(t.TempDir(), "storage"), MountPoint: n.StateDir},
	}
	t.Cleanup(func() { _ = p.State.Lock(context.Background()) })
	return p
}

// Name implements boot.Platform.
func (p *Platform) Name() string { return PlatformName }

// Metadata implements boot.Platform.
func (p *Platform) Metadata(context.Context) (boot.Metadata, error) {
	return platformMeta{p.Meta, p}, nil
}

// Attestation implements boot.Platform: the node's swtpm, and the event log of its boot.
func (p *Platform) Attestation() (variant.Variant, choose.IssuerEnv) {
	return softfirmware.Variant, choose.IssuerEnv{TPM: vtpm.OpenAddr(p.Node.swtpm.Addr()), AK: vtpm.AKRSA, EventLog: p.Node.ReadEventLog}
}

// NodeConfig implements boot.Platform.
func (p *Platform) NodeConfig() (boot.NodeConfig, error) {
	return boot.NodeConfig{KubernetesVersion: "v1.34.4", ServicesImage: "localhost/constellation/services:bootstraptest"}, nil
}

// Storage implements boot.Platform.
func (p *Platform) Storage() (statedisk.Storage, error) { return p.State, nil }

// OS implements boot.Platform.
func (p *Platform) OS(_ context.Context, self metadata.Instance) (boot.OS, error) {
	p.NodeOS.mu.Lock()
	defer p.NodeOS.mu.Unlock()
	p.NodeOS.booted = append(p.NodeOS.booted, self.Name)
	return p.NodeOS, nil
}

// Volumes implements boot.Platform: the test platform has no volumes.
func (p *Platform) Volumes() (csidriver.Devices, csidriver.Unlocker, error) {
	return nil, nil, errors.New("the test platform has no volumes")
}

// Services implements boot.Platform.
func (p *Platform) Services() deploy.PlatformFacts {
	return deploy.PlatformFacts{Name: PlatformName, MetadataURL: "http://127.0.0.1:1", TPM: filepath.Clean(p.Node.swtpm.Addr()[len("unix:"):]), TPMKind: deploy.TPMSocket}
}

// Reports are the phases the node reported, in order.
func (p *Platform) Reports() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.reports...)
}

// ClusterIDRegister reads the node's cluster-ID register, opening its TPM for the read.
func (p *Platform) ClusterIDRegister(t testing.TB) []byte {
	t.Helper()
	tpm, err := p.Node.swtpm.Open(context.Background())
	require.NoError(t, err)
	defer tpm.Close()
	pcrs, err := tpm.ReadPCRs(int(clusterIDRegister))
	require.NoError(t, err)
	return pcrs[clusterIDRegister]
}

type platformMeta struct {
	*metadata.Static
	p *Platform
}

func (m platformMeta) ReportDetail(_ context.Context, phase, _ string) error {
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	m.p.reports = append(m.p.reports, phase)
	return nil
}

// OS stands in for the node's OS: it records what the node program asks of it.
type OS struct {
	mu          sync.Mutex
	booted      []string
	stateMounts int
	kubelet     platformKubelet
}

// Booted names the nodes the OS was booted for.
func (o *OS) Booted() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.booted...)
}

// StateMounts counts MountState calls.
func (o *OS) StateMounts() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stateMounts
}

// NodeSettings implements boot.OS.
func (o *OS) NodeSettings() kubeadmconfig.NodeSettings {
	return kubeadmconfig.NodeSettings{CRISocket: "unix:///run/containerd/containerd.sock"}
}

// Kubeadm implements boot.OS: no kubeadm runs on the test platform.
func (o *OS) Kubeadm() string { return filepath.Join(os.TempDir(), "bootstraptest-has-no-kubeadm") }

// Kubelet implements boot.OS.
func (o *OS) Kubelet() boot.Kubelet { return &o.kubelet }

// WaitImages implements boot.OS.
func (o *OS) WaitImages(context.Context) error { return nil }

// MountState implements boot.OS.
func (o *OS) MountState() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stateMounts++
	return nil
}

// Logs implements boot.OS.
func (o *OS) Logs(context.Context) []byte { return nil }

// platformKubelet counts the kubelet's starts and restarts.
type platformKubelet struct {
	mu               sync.Mutex
	starts, restarts int
	failed           chan error
}

func (k *platformKubelet) Start(context.Context) { k.mu.Lock(); k.starts++; k.mu.Unlock() }
func (k *platformKubelet) Restart(context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.restarts++
	return nil
}
func (k *platformKubelet) ExitIsFatal() {}
func (k *platformKubelet) Failed() <-chan error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failed == nil {
		k.failed = make(chan error)
	}
	return k.failed
}

var _ boot.Platform = (*Platform)(nil)
