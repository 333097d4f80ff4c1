// Package simnodes runs, for tests, a sandbox node behind each VM of a simulated
// subscription (azuresim), so that a cluster created by the Azure provider's host half has
// nodes that answer: the CLI's init, joins, scaling and the upgrade roll run on it end to end.
//
// A VM that starts boots a node of the local provider's sandbox of the same name, role and
// node image (the VM's image reference, mapped to a node image folder); a VM that restarts,
// deallocates or is deleted reboots, shuts down or deletes its node. The simulated cloud's
// load balancer is real on this host (azuresim.Cloud.ServeInternet): the CLI reaches the API
// endpoint and each node's ports through the rules the host half made, and a rule's backend
// port is the node's. A node's reports reach the VM's serial log, where the host half reads
// them through boot diagnostics.
//
// What stands in for Azure here is the machine, not the node half: the nodes run the
// sandbox's node platform (its metadata service, swtpm and attestation variant), not Azure's
// (IMDS, the vTPM's HCL report), because no hardware report signed by AMD or Intel can exist
// here. The Azure node half is tested on the simulated cloud's state on its own (azurenode).
// docs/azure.md "Tests" says what this covers and what not.
package simnodes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	localplatform "github.com/openconstellation/constellation/internal/provider/local/platform"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// bootTimeout bounds booting or changing one node.
const bootTimeout = 5 * time.Minute

// Options are the machines' parts.
type Options struct {
	// Subscription is the simulated subscription's ID.
	Subscription string
	// Exe is the constellation binary that serves the sandbox (its provider process).
	Exe string
	// Dir is the sandbox's folder (created).
	Dir string
	// ImagesDir holds the container images the nodes import (make images).
	ImagesDir string
	// Images maps the VMs' image references (gallery image version IDs) to node image
	// folders of the local provider.
	Images map[string]string
}

// Machines are the sandbox nodes behind the VMs of one simulated subscription.
type Machines struct {
	Cloud *azuresim.Cloud
	t     testing.TB
	o     Options

	// ops serializes what the VMs' hooks do to the nodes; mu guards sandbox and images.
	ops     sync.Mutex
	mu      sync.Mutex
	sandbox *cluster.Local
	images  map[string]string
	// logs are the VMs' serial logs, by VM name.
	logMu sync.Mutex
	logs  map[string]string
}

// New returns the machines of a new simulated subscription, whose public addresses are
// real on this host. Everything it boots is removed when the test ends.
func New(t testing.TB, o Options) *Machines {
	t.Helper()
	m := &Machines{t: t, o: o, logs: map[string]string{}, images: map[string]string{}}
	for ref, dir := range o.Images {
		m.images[ref] = dir
	}
	m.Cloud = azuresim.New(o.Subscription, azuresim.Hooks{Started: m.started, Stopped: m.stopped, Console: m.console})
	stopBlobs := m.Cloud.ServeBlobs()
	stop := m.Cloud.ServeInternet(m.reach)
	t.Cleanup(func() {
		stop()
		stopBlobs()
		if sandbox := m.current(); sandbox != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := sandbox.Destroy(ctx); err != nil {
				t.Errorf("removing the sandbox: %v", err)
			}
		}
	})
	return m
}

// Platform is the Azure provider on the simulated subscription with these machines, as the
// CLI's catalog registers it (catalog.Register).
func (m *Machines) Platform() provider.Platform {
	return Platform{Platform: azure.Platform{Credential: azuresim.Credential, Transport: m.Cloud.Transport(), PollEvery: 10 * time.Millisecond}, m: m}
}

// SetImage makes VMs booting image reference ref boot the node image folder dir from now on:
// what whoever can write the gallery can do to a version.
func (m *Machines) SetImage(ref, dir string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for r := range m.images {
		if strings.EqualFold(r, ref) {
			delete(m.images, r)
		}
	}
	m.images[ref] = dir
}

// imageDir is the node image folder of a VM's image reference.
func (m *Machines) imageDir(ref string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for r, dir := range m.images {
		if strings.EqualFold(r, ref) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no node image stands in for the VM image %s", ref)
}

// started boots the VM's node, or powers it on again.
func (m *Machines) started(rg, name string) {
	if err := m.boot(rg, name); err != nil {
		m.t.Errorf("simnodes: VM %s started, but its node did not: %v", name, err)
	}
}

func (m *Machines) boot(rg, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	m.ops.Lock()
	defer m.ops.Unlock()
	vm, ok := m.Cloud.VM(rg, name)
	if !ok {
		return nil // deleted meanwhile
	}
	sandbox := m.current()
	if sandbox != nil {
		n, found, err := node(ctx, sandbox, name)
		if err != nil {
			return err
		}
		if found {
			if n.State == provider.Stopped {
				return sandbox.RebootNode(ctx, name)
			}
			return nil // a restart: stopped rebooted it
		}
	}
	if vm.Properties == nil || vm.Properties.StorageProfile == nil || vm.Properties.StorageProfile.ImageReference == nil || vm.Properties.StorageProfile.ImageReference.ID == nil {
		return errors.New("the VM has no image reference")
	}
	image, err := m.imageDir(*vm.Properties.StorageProfile.ImageReference.ID)
	if err != nil {
		return err
	}
	role := metadata.Role(tag(vm.Tags, azuremeta.TagRole))
	if role != metadata.ControlPlane && role != metadata.Worker {
		return fmt.Errorf("the VM's %s tag is %q", azuremeta.TagRole, role)
	}
	spec := provider.NodeSpec{Name: name, Role: role, Image: image}
	if sandbox != nil {
		_, err := sandbox.CreateNodes(ctx, []provider.NodeSpec{spec})
		return err
	}
	// The first node: the sandbox itself, with the init secret's hash the host half put on
	// the control planes' VMs (the first VM it creates is a control plane).
	hash := tag(vm.Tags, azuremeta.TagInitSecretHash)
	if hash == "" {
		return fmt.Errorf("the first VM has no %s tag", azuremeta.TagInitSecretHash)
	}
	if err := os.MkdirAll(m.o.Dir, 0o700); err != nil {
		return err
	}
	s := cluster.Spec{Dir: m.o.Dir, ImagesDir: m.o.ImagesDir, InitSecretHash: hash, Nodes: []cluster.NodeSpec{{NodeSpec: spec}}}
	if s.AKCACert, s.AKCAKey, err = localplatform.WriteAKCA(m.o.Dir); err != nil {
		return err
	}
	sandbox, err = cluster.Launch(ctx, m.o.Exe, s)
	m.mu.Lock()
	m.sandbox = sandbox
	m.mu.Unlock()
	return err
}

// current is the sandbox, once the first VM booted it.
func (m *Machines) current() *cluster.Local {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sandbox
}

// stopped follows a VM that stopped running: deleted, its node is deleted; restarted, its
// node reboots; deallocated, its node shuts down.
func (m *Machines) stopped(rg, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	m.ops.Lock()
	defer m.ops.Unlock()
	sandbox := m.current()
	if sandbox == nil {
		return
	}
	var err error
	switch m.Cloud.Power(rg, name) {
	case "":
		err = sandbox.DeleteNode(ctx, name)
	case "running":
		err = sandbox.RebootNode(ctx, name)
	default:
		err = sandbox.ShutdownNode(ctx, name)
	}
	if err != nil && !errors.Is(err, provider.ErrNoNode) {
		m.t.Errorf("simnodes: VM %s stopped, but its node did not follow: %v", name, err)
	}
}

// node is the sandbox's node name.
func node(ctx context.Context, sandbox *cluster.Local, name string) (provider.Node, bool, error) {
	nodes, err := sandbox.Nodes(ctx)
	if err != nil {
		return provider.Node{}, false, err
	}
	for _, n := range nodes {
		if n.Name == name {
			return n, true, nil
		}
	}
	return provider.Node{}, false, nil
}

// reach connects to a port of the VM's node, in the sandbox's network.
func (m *Machines) reach(ctx context.Context, _, vm string, port int) (net.Conn, error) {
	sandbox := m.current()
	if sandbox == nil {
		return nil, errors.New("no node booted yet")
	}
	n, found, err := node(ctx, sandbox, vm)
	if err != nil {
		return nil, err
	}
	if !found || len(n.IPs) == 0 {
		return nil, fmt.Errorf("VM %s has no node: %w", vm, provider.ErrNoNode)
	}
	return sandbox.Dialer()(ctx, net.JoinHostPort(n.IPs[0].String(), strconv.Itoa(port)))
}

// console is the VM's serial log: its node's reports, as the Azure node half writes them
// (the sandbox's nodes report to its metadata service; this is the cable to the console).
// The log keeps every boot's reports, as a serial log does: after a restart it ends with the
// previous boot's last report until the node reports again.
func (m *Machines) console(_, vm string) []byte {
	m.logMu.Lock()
	defer m.logMu.Unlock()
	if sandbox := m.current(); sandbox != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if n, found, err := node(ctx, sandbox, vm); err == nil && found && n.Reported != "" {
			line := azuremeta.ConsoleReport{Phase: n.Reported, Detail: n.ReportedDetail, Boot: n.BootedAt}.Line()
			if !strings.HasSuffix(m.logs[vm], line) {
				m.logs[vm] += line
			}
		}
	}
	return []byte(m.logs[vm])
}

// attestation is how the sandbox's nodes attest.
func (m *Machines) attestation(ctx context.Context) (provider.Attestation, error) {
	sandbox := m.current()
	if sandbox == nil {
		return provider.Attestation{}, errors.New("no node booted yet")
	}
	return sandbox.Attestation(ctx)
}

func tag(tags map[string]*string, name string) string {
	if v := tags[name]; v != nil {
		return *v
	}
	return ""
}

// Platform is the Azure provider's host half on the simulated subscription, with the
// sandbox's attestation: its nodes attest as sandbox nodes (local.Variant), so a
// configuration names that variant and the sandbox image's reference values.
type Platform struct {
	azure.Platform
	m *Machines
}

// ConfigRules implements provider.Platform: Azure's, with the sandbox's variant.
func (Platform) ConfigRules() config.ProviderRules { return rules{} }

type rules struct{ azure.ConfigRules }

func (rules) Variants() []variant.Variant { return []variant.Variant{local.Variant} }

// ReferenceValues implements provider.Platform: the sandbox's of the node image that stands
// in for the VM image.
func (p Platform) ReferenceValues(image string) (provider.ReferenceValues, error) {
	dir, err := p.m.imageDir(image)
	if err != nil {
		return provider.ReferenceValues{}, err
	}
	return localplatform.Platform{}.ReferenceValues(dir)
}

// Create implements provider.Platform.
func (p Platform) Create(ctx context.Context, req provider.CreateRequest) (provider.Provider, error) {
	prov, err := p.Platform.Create(ctx, req)
	if err != nil {
		return nil, err
	}
	return clusterOn{Provider: prov, m: p.m}, nil
}

// Open implements provider.Platform.
func (p Platform) Open(workspace string) (provider.Provider, error) {
	prov, err := p.Platform.Open(workspace)
	if err != nil {
		return nil, err
	}
	return clusterOn{Provider: prov, m: p.m}, nil
}

// Remove implements provider.Platform: the cluster's resources (their nodes with them),
// then the sandbox.
func (p Platform) Remove(ctx context.Context, workspace string) (int, error) {
	n, err := p.Platform.Remove(ctx, workspace)
	if err != nil {
		return n, err
	}
	p.m.ops.Lock()
	defer p.m.ops.Unlock()
	if sandbox := p.m.current(); sandbox != nil {
		if err := sandbox.Destroy(ctx); err != nil {
			return n, err
		}
		p.m.mu.Lock()
		p.m.sandbox = nil
		p.m.mu.Unlock()
	}
	return n, nil
}

// clusterOn is a cluster of the Azure provider whose nodes attest as the sandbox's.
type clusterOn struct {
	provider.Provider
	m *Machines
}

// Attestation implements provider.Provider.
func (c clusterOn) Attestation(ctx context.Context) (provider.Attestation, error) {
	return c.m.attestation(ctx)
}
