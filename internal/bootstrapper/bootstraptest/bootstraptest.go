// Package bootstraptest sets up real node parts for bootstrapper tests: a measured swtpm
// with a certified AK, gocryptfs state storage, the node lock, and a kubeadm stand-in for
// tests that do not run the real kubeadm (the local-provider end-to-end tests do).
package bootstraptest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/bootstrapper/node"
	"github.com/openconstellation/constellation/internal/bootstrapper/nodelock"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/swtpm"
)

// The registers the harness's image is measured into (softfirmware), as the sandbox's image
// measures its bootstrapper and node configuration.
const (
	PCRBootstrapper = 11
	PCRNodeConfig   = 12
)

// Image is the node image the test nodes boot.
var Image = []softfirmware.Component{
	softfirmware.BytesComponent("bootstrapper", PCRBootstrapper, []byte("bootstrapper under test")),
	softfirmware.BytesComponent("node config", PCRNodeConfig, []byte("node config under test")),
}

// Node is one test node: real TPM and storage.
type Node struct {
	Name    string
	opts    NodeOptions
	TPM     *vtpm.TPM
	swtpm   *swtpm.Process
	tpmDir  string
	Storage *statedisk.Gocryptfs
	Lock    *nodelock.Lock
	Node    *node.Node
	// StateDir is where the unlocked storage is visible.
	StateDir string
	// EventLog is the event log of the node's current boot (softfirmware.MeasureLogged), which its
	// issuers send as the node's do.
	EventLog []byte
}

// NodeOptions describe a test node's platform: what the provider measures and certifies.
type NodeOptions struct {
	// Role is what the provider certifies the node's AKs for (default control plane).
	Role metadata.Role
	// Image is what the node boots (default Image).
	Image []softfirmware.Component
	// Uncertified: the provider certifies no AK (and provisions no AK root).
	Uncertified bool
}

// NewNode boots a node from Image on a fresh swtpm as the local provider does (measure,
// certify its AKs for role with ca, provision ca as its AK root, lock the platform
// hierarchy) and opens it (creating its storage). It is torn down when t ends.
func NewNode(t testing.TB, name string, role metadata.Role, ca *akca.CA) *Node {
	t.Helper()
	return NewNodeWith(t, name, ca, NodeOptions{Role: role})
}

// NewNodeWith is NewNode with the platform described by opts.
func NewNodeWith(t testing.TB, name string, ca *akca.CA, opts NodeOptions) *Node {
	t.Helper()
	n := bootNode(t, name, ca, opts)
	n.Storage = &statedisk.Gocryptfs{Dir: filepath.Join(t.TempDir(), "storage"), MountPoint: n.StateDir}
	t.Cleanup(func() { assert.NoError(t, n.Storage.Lock(context.Background())) })
	n.open(t)
	return n
}

// bootNode boots a node from opts.Image on a fresh swtpm as the local provider does (measure,
// certify, lock the platform hierarchy), with its TPM open. It is torn down when t ends.
func bootNode(t testing.TB, name string, ca *akca.CA, opts NodeOptions) *Node {
	t.Helper()
	if opts.Role == "" {
		opts.Role = metadata.ControlPlane
	}
	if opts.Image == nil {
		opts.Image = Image
	}
	// os.MkdirTemp, not t.TempDir: test names can push a socket path past 107 bytes.
	tpmDir, err := os.MkdirTemp("", "swtpm")
	require.NoError(t, err)
	dir := t.TempDir()
	n := &Node{Name: name, opts: opts, tpmDir: tpmDir, StateDir: filepath.Join(dir, "state")}
	t.Cleanup(func() {
		n.powerOff()
		_ = os.RemoveAll(tpmDir)
	})
	n.powerOn(t, func() {
		if !opts.Uncertified {
			require.NoError(t, softfirmware.CertifyAK(n.TPM, ca, name, opts.Role, time.Now()))
		}
	})
	return n
}

// powerOn starts the node's swtpm (PCRs reset, persistent state kept), measures the image,
// runs certify (first boot) and locks the platform hierarchy, as the provider does at every
// boot (internal/provider/local/cluster).
func (n *Node) powerOn(t testing.TB, certify func()) {
	var err error
	n.swtpm, err = swtpm.Start(context.Background(), swtpm.Options{StateDir: n.tpmDir})
	require.NoError(t, err)
	n.TPM, err = n.swtpm.Open(context.Background())
	require.NoError(t, err)
	n.EventLog, err = softfirmware.MeasureLogged(n.TPM, n.opts.Image)
	require.NoError(t, err)
	certify()
	require.NoError(t, softfirmware.LockPlatform(n.TPM))
}

func (n *Node) powerOff() {
	if n.TPM != nil {
		_ = n.TPM.Close()
	}
	if n.swtpm != nil {
		_ = n.swtpm.Stop()
	}
}

// Reboot simulates a reboot: the storage is locked, the TPM restarts (PCRs reset, keys
// and NV kept) and is measured again, and the node is reopened.
func (n *Node) Reboot(t testing.TB) {
	t.Helper()
	require.NoError(t, n.Storage.Lock(context.Background()))
	n.powerOff()
	n.powerOn(t, func() {})
	n.open(t)
}

// Restart simulates a bootstrapper restart within the boot: the storage is locked and the
// node reopened; the TPM keeps its PCRs.
func (n *Node) Restart(t testing.TB) {
	t.Helper()
	require.NoError(t, n.Storage.Lock(context.Background()))
	n.open(t)
}

func (n *Node) open(t testing.TB) {
	var err error
	n.Lock, err = nodelock.New(n.TPM, softfirmware.Variant)
	require.NoError(t, err)
	n.Node, err = node.Open(context.Background(), n.Lock, n.Storage)
	require.NoError(t, err)
}

// ClusterIDRegister reads the node's cluster-ID register (its variant's; PCR 15).
func (n *Node) ClusterIDRegister(t testing.TB) []byte {
	t.Helper()
	pcrs, err := n.TPM.ReadPCRs(int(clusterIDRegister))
	require.NoError(t, err)
	return pcrs[clusterIDRegister]
}

// Issuer returns the node's evidence issuer (qemu-vtpm, certified RSA AK), sending the event
// log of the node's current boot.
func (n *Node) Issuer(t testing.TB) *vtpm.Issuer {
	t.Helper()
	iss, err := qemu.NewIssuer(n.TPM, nil, n.ReadEventLog)
	require.NoError(t, err)
	t.Cleanup(func() { iss.Close() })
	return iss
}

// ReadEventLog returns the event log of the node's current boot: an issuer's EventLog.
func (n *Node) ReadEventLog() ([]byte, error) { return n.EventLog, nil }

// Validator accepts nodes booted from Image with AKs certified by ca.
func Validator(t testing.TB, ca *akca.CA) *vtpm.Validator {
	t.Helper()
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "test-image", Measurements: softfirmware.ExpectedPCRs(Image)}}},
		AKRoots:         ca.Pool(),
	})
	require.NoError(t, err)
	return v
}

// Kubeadm stands in for kubeadm: it records its calls, writes output, and on Init installs
// a prepared admin kubeconfig where kubeadm would write it.
type Kubeadm struct {
	// AdminKubeconfig is copied to AdminKubeconfigPath on Init.
	AdminKubeconfig     []byte
	AdminKubeconfigPath string
	// Fail, when set, makes the call fail after writing Output.
	Fail   error
	Output string
	// Block, when set, is waited for before the call returns.
	Block chan struct{}

	mu      sync.Mutex
	Calls   []string
	Configs [][]byte
	// Discovery holds, per join, the discovery kubeconfig the configuration names, read
	// while the call runs (as kubeadm reads it).
	Discovery [][]byte
}

// Init implements node.Kubeadm.
func (k *Kubeadm) Init(ctx context.Context, config []byte, out io.Writer) error {
	if err := k.call(ctx, "init", config, out); err != nil {
		return err
	}
	return os.WriteFile(k.AdminKubeconfigPath, k.AdminKubeconfig, 0o600)
}

// Join implements node.Kubeadm.
func (k *Kubeadm) Join(ctx context.Context, config []byte, out io.Writer) error {
	var discovery []byte
	if m := discoveryFile.FindSubmatch(config); m != nil {
		var err error
		if discovery, err = os.ReadFile(string(m[1])); err != nil {
			return fmt.Errorf("kubeadm join: reading the discovery file: %w", err)
		}
	}
	k.mu.Lock()
	k.Discovery = append(k.Discovery, discovery)
	k.mu.Unlock()
	return k.call(ctx, "join", config, out)
}

// discoveryFile finds the discovery kubeconfig in a JoinConfiguration.
var discoveryFile = regexp.MustCompile(`(?m)^\s+kubeConfigPath: (\S+)$`)

func (k *Kubeadm) call(ctx context.Context, name string, config []byte, out io.Writer) error {
	k.mu.Lock()
	k.Calls = append(k.Calls, name)
	k.Configs = append(k.Configs, config)
	k.mu.Unlock()
	if k.Output != "" {
		fmt.Fprint(out, k.Output)
	}
	if k.Block != nil {
		select {
		case <-k.Block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if k.Fail != nil {
		return fmt.Errorf("kubeadm %s: %w", name, k.Fail)
	}
	return nil
}

// CallList returns the calls so far.
func (k *Kubeadm) CallList() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.Calls...)
}

// Kubelet stands in for the node's service manager: it counts restarts.
type Kubelet struct {
	mu       sync.Mutex
	restarts int
	// renewals counts RenewCredential calls; staleRestarts the restarts without a renewal
	// since the previous restart.
	renewals, staleRestarts, renewedSinceRestart int
}

// Restart implements node.Kubelet.
func (k *Kubelet) Restart(context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.restarts++
	if k.renewedSinceRestart == 0 {
		k.staleRestarts++
	}
	k.renewedSinceRestart = 0
	return nil
}

// RenewCredential stands in for renewing the kubelet's client certificate
// (recoveryserver.Config.RenewKubeletCredential).
func (k *Kubelet) RenewCredential() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.renewals++
	k.renewedSinceRestart++
	return nil
}

// Renewals returns how often RenewCredential was called, and how many restarts came
// without a renewal before them.
func (k *Kubelet) Renewals() (renewals, staleRestarts int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.renewals, k.staleRestarts
}

// Restarts returns how often Restart was called.
func (k *Kubelet) Restarts() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.restarts
}
