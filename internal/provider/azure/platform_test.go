package azure

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim"
	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

const testImage = "/subscriptions/" + testSub + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/constellation/versions/1.0.0"

func testConfig(v variant.Variant) *config.Config {
	c := config.Default()
	c.Name = "mini"
	c.Provider = config.ProviderFor(Name, config.ProviderBlock{ControlPlanes: 1, Workers: 1, Image: testImage, Settings: map[string]any{
		"subscriptionID": testSub, "resourceGroup": "mini-rg", "location": "westeurope",
	}})
	c.Attestation = config.AttestationFor(v, config.VariantConfig{Measurements: measurements.ReferenceSets{{
		Name: "test", Measurements: measurementstest.Image(v, map[uint32][]byte{4: make([]byte, 32)}),
	}}})
	return c
}

// simPlatform is the platform as the catalog registers it, on a simulated subscription.
func simPlatform(cloud *azuresim.Cloud) Platform {
	return Platform{Credential: azuresim.Credential, Transport: cloud.Transport(), tune: func(c *clients) {
		c.pollEvery = time.Millisecond
		c.retry = retry.Policy{Initial: time.Millisecond, Max: 10 * time.Millisecond, Factor: 2}
	}}
}

// TestLifecycle runs a cluster's life on the simulated subscription through the platform:
// create, list, reboot, scale up and down, stop, start, the endpoints and the dial path, a
// rerun of create after a killed run, and removal.
func TestLifecycle(t *testing.T) {
	var mu sync.Mutex
	boots := map[string]int{}
	booted := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	cloud := azuresim.New(testSub, azuresim.Hooks{
		Started: func(_, vm string) { mu.Lock(); boots[vm]++; mu.Unlock() },
		// control-plane-0's node reported on its serial console; worker-0's wrote nothing.
		Console: func(_, vm string) []byte {
			if vm != "control-plane-0" {
				return nil
			}
			return []byte("[    0.000000] Linux version 6.12\n" + azuremeta.ConsoleReport{Phase: "initialized", Boot: booted}.Line() + "noise\n")
		},
	})
	t.Cleanup(cloud.ServeBlobs())
	p := simPlatform(cloud)
	ws := t.TempDir()
	ctx := t.Context()
	nodes := []provider.NodeSpec{{Name: "control-plane-0", Role: metadata.ControlPlane}, {Name: "worker-0", Role: metadata.Worker}}

	_, err := p.Create(ctx, provider.CreateRequest{Workspace: ws, Config: testConfig(variant.AzureSEVSNP), Nodes: nodes})
	require.NoError(t, err)
	secret, err := p.InitSecret(ws)
	require.NoError(t, err)
	assert.Len(t, secret, 32)
	info, err := os.Stat(filepath.Join(ws, Folder, initSecretFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	// The control plane carries the hash of the init secret, never the secret.
	vm, ok := cloud.VM("mini-rg", "control-plane-0")
	require.True(t, ok)
	assert.NotContains(t, string(marshal(t, vm)), string(secret))
	assert.Contains(t, vm.Tags, azuremeta.TagInitSecretHash)
	workerVM, _ := cloud.VM("mini-rg", "worker-0")
	assert.NotContains(t, workerVM.Tags, azuremeta.TagInitSecretHash)

	// A rerun after a killed create adopts the cluster: same record, nothing created twice.
	_, err = p.Create(ctx, provider.CreateRequest{Workspace: ws, Config: testConfig(variant.AzureSEVSNP), Nodes: nodes})
	require.NoError(t, err)
	assert.Equal(t, 2, cloud.Count("VirtualMachinesClient.BeginCreateOrUpdate"))

	prov, err := p.Open(ws)
	require.NoError(t, err)
	before := len(cloud.Calls())
	list, err := prov.Nodes(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	// Two listings (VMs; interfaces, in two pages), a state read per node and, the first time,
	// a link to each node's serial log: what the CLI's waits cost against Resource Manager's
	// read limits. The links are kept.
	assert.Len(t, cloud.Calls()[before:], 1+2+2*len(list), "%v", cloud.Calls()[before:])
	assert.Equal(t, provider.Running, list[0].State)
	assert.Equal(t, "initialized", list[0].Reported, "the node's report on its serial console")
	assert.True(t, booted.Equal(list[0].BootedAt))
	assert.Empty(t, list[1].Reported)
	assert.Empty(t, list[1].Detail, "an empty serial log is no error")
	before = len(cloud.Calls())
	_, err = prov.Nodes(ctx)
	require.NoError(t, err)
	assert.Len(t, cloud.Calls()[before:], 1+2+len(list), "%v", cloud.Calls()[before:])
	require.Len(t, list[0].IPs, 1)
	assert.True(t, NodeNetwork.Contains(list[0].IPs[0]))

	ep, err := prov.Endpoints(ctx)
	require.NoError(t, err)
	assert.Equal(t, "203.0.113.1:6443", ep.APIServer)
	c := prov.(*Cluster)
	for i, n := range list {
		got, err := c.natAddress(ctx, net.JoinHostPort(n.IPs[0].String(), strconv.Itoa(provider.VerificationPort)))
		require.NoError(t, err)
		assert.Equal(t, "203.0.113.1:"+strconv.Itoa(natPortBase+i*len(dialPorts)+2), got, n.Name)
	}
	_, err = c.natAddress(ctx, net.JoinHostPort(list[0].IPs[0].String(), "22"))
	assert.ErrorContains(t, err, "not reachable through the load balancer")

	require.NoError(t, prov.RebootNode(ctx, "worker-0"))
	assert.Equal(t, 2, boots["worker-0"])
	assert.ErrorIs(t, prov.RebootNode(ctx, "worker-9"), provider.ErrNoNode)

	// Scale up: the new node takes the free slot after the others'.
	// It boots the image its spec names (an upgrade's replacement), the others keep theirs.
	next := strings.Replace(testImage, "1.0.0", "1.1.0", 1)
	added, err := prov.CreateNodes(ctx, []provider.NodeSpec{{Name: "worker-1", Role: metadata.Worker, Image: next}})
	require.NoError(t, err)
	require.Len(t, added, 1)
	assert.Equal(t, next, added[0].Image)
	assert.Equal(t, next, *mustVM(t, cloud, "worker-1").Properties.StorageProfile.ImageReference.ID)
	assert.Equal(t, testImage, mustNode(t, prov, "worker-0").Image)
	// Azure may answer a VM's image reference in another case: the node still lists the image
	// as it was asked for, or an upgrade would take its replacement for a stale node.
	cloud.AnswerImageReferences(strings.ToLower)
	_, err = prov.CreateNodes(ctx, []provider.NodeSpec{{Name: "worker-2", Role: metadata.Worker, Image: next}})
	require.NoError(t, err)
	assert.Equal(t, strings.ToLower(next), *mustVM(t, cloud, "worker-2").Properties.StorageProfile.ImageReference.ID)
	assert.Equal(t, next, mustNode(t, prov, "worker-2").Image)
	cloud.AnswerImageReferences(nil)
	require.NoError(t, prov.DeleteNode(ctx, "worker-2"))
	_, err = prov.CreateNodes(ctx, []provider.NodeSpec{{Name: "worker-9", Role: metadata.Worker, Image: "/releases/v0.2.0/node-image"}})
	assert.ErrorContains(t, err, `node worker-9: provider.azure.image: "/releases/v0.2.0/node-image" is not a gallery image version's resource ID`)
	_, ok = cloud.VM("mini-rg", "worker-9")
	assert.False(t, ok)
	assert.Equal(t, "2", *mustVM(t, cloud, "worker-1").Tags[tagSlot])
	routes, ok := cloud.RouteTable("mini-rg", "mini-routes")
	require.True(t, ok)
	got := map[string]string{}
	for _, r := range routes.Properties.Routes {
		got[*r.Name] = *r.Properties.AddressPrefix + " via " + *r.Properties.NextHopIPAddress
	}
	assert.Len(t, got, 3, "a route per node")
	assert.Equal(t, "10.244.2.0/24 via "+mustNode(t, prov, "worker-1").IPs[0].String(), got["worker-1"])
	assert.Equal(t, "10.244.2.0/24", *mustVM(t, cloud, "worker-1").Tags[azuremeta.TagPodNetwork])
	assert.Equal(t, "203.0.113.1:6443", *mustVM(t, cloud, "worker-1").Tags[azuremeta.TagAPIEndpoint])

	require.NoError(t, prov.DeleteNode(ctx, "worker-0"))
	routes, _ = cloud.RouteTable("mini-rg", "mini-routes")
	assert.Len(t, routes.Properties.Routes, 2, "the deleted node's route is gone")
	_, ok = cloud.VM("mini-rg", "worker-0")
	assert.False(t, ok)
	assert.NotContains(t, cloud.Resources("mini-rg"), testLayout.id("Microsoft.Compute/disks", "worker-0-state"))
	// The freed slot is taken again.
	_, err = prov.CreateNodes(ctx, []provider.NodeSpec{{Name: "worker-2", Role: metadata.Worker}})
	require.NoError(t, err)
	assert.Equal(t, "1", *mustVM(t, cloud, "worker-2").Tags[tagSlot])

	require.NoError(t, prov.Stop(ctx))
	list, err = prov.Nodes(ctx)
	require.NoError(t, err)
	for _, n := range list {
		assert.Equal(t, provider.Stopped, n.State, n.Name)
	}
	require.NoError(t, prov.RebootNode(ctx, "worker-1"), "a stopped node is started")
	assert.Equal(t, "running", cloud.Power("mini-rg", "worker-1"))
	require.NoError(t, prov.Start(ctx))
	assert.Equal(t, "running", cloud.Power("mini-rg", "control-plane-0"))

	n, err := p.Remove(ctx, ws)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Empty(t, cloud.Groups())
	assert.NoDirExists(t, filepath.Join(ws, Folder))
	n, err = p.Remove(ctx, ws)
	require.NoError(t, err, "removing nothing is no error")
	assert.Zero(t, n)
}

func mustVM(t *testing.T, cloud *azuresim.Cloud, name string) armcompute.VirtualMachine {
	t.Helper()
	vm, ok := cloud.VM("mini-rg", name)
	require.True(t, ok, name)
	return vm
}

func TestCreateRefuses(t *testing.T) {
	cloud := azuresim.New(testSub, azuresim.Hooks{})
	p := simPlatform(cloud)
	testCases := map[string]struct {
		edit    func(*config.Config)
		wantErr string
	}{
		"not a gallery image": {
			edit:    func(c *config.Config) { c.Provider.Block().Image = "/tmp/vm-image" },
			wantErr: `provider.azure.image: "/tmp/vm-image" is not a gallery image version's resource ID`,
		},
		"a misspelled setting": {
			edit:    func(c *config.Config) { c.Provider.Block().Settings["locaton"] = "x" },
			wantErr: "provider.azure.settings: locaton: unknown field",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			conf := testConfig(variant.AzureSEVSNP)
			tc.edit(conf)
			_, err := p.Create(t.Context(), provider.CreateRequest{Workspace: t.TempDir(), Config: conf})
			assert.ErrorContains(t, err, tc.wantErr)
			assert.Empty(t, cloud.Calls(), "nothing asked of Azure")
		})
	}
	// The image the CLI resolved is what is checked, not only the configured one.
	conf := testConfig(variant.AzureSEVSNP)
	_, err := p.Create(t.Context(), provider.CreateRequest{Workspace: t.TempDir(), Config: conf,
		Nodes: []provider.NodeSpec{{Name: "control-plane-0", Role: metadata.ControlPlane, Image: "/releases/v0.2.0/node-image"}}})
	assert.ErrorContains(t, err, `"/releases/v0.2.0/node-image" is not a gallery image version's resource ID`)
	assert.Empty(t, cloud.Calls(), "nothing asked of Azure")
}

// A cluster created from a release boots the release's Azure image, which the CLI resolved
// (release.CloudImage) and passes in the nodes' specs: provider.azure.image names the release.
func TestCreateBootsTheImageTheCLIResolved(t *testing.T) {
	cloud := azuresim.New(testSub, azuresim.Hooks{})
	p := simPlatform(cloud)
	conf := testConfig(variant.AzureSEVSNP)
	conf.Provider.Block().Image = "releases/v0.2.0"
	released := strings.Replace(testImage, "1.0.0", "2.0.0", 1)
	ws := t.TempDir()
	prov, err := p.Create(t.Context(), provider.CreateRequest{Workspace: ws, Config: conf, Nodes: []provider.NodeSpec{
		{Name: "control-plane-0", Role: metadata.ControlPlane, Image: released},
	}})
	require.NoError(t, err)
	assert.Equal(t, released, *mustVM(t, cloud, "control-plane-0").Properties.StorageProfile.ImageReference.ID)
	assert.Equal(t, released, mustNode(t, prov, "control-plane-0").Image)
	// A node added without an image boots the cluster's.
	_, err = prov.CreateNodes(t.Context(), []provider.NodeSpec{{Name: "worker-0", Role: metadata.Worker}})
	require.NoError(t, err)
	assert.Equal(t, released, *mustVM(t, cloud, "worker-0").Properties.StorageProfile.ImageReference.ID)
	_, err = p.Remove(t.Context(), ws)
	require.NoError(t, err)
}

// TestListerSeesTheNodes: the join service's lister (azuremeta, with the nodes' identity)
// lists the nodes the host half created, with their roles and addresses, and nothing of
// another cluster in the same group.
func TestListerSeesTheNodes(t *testing.T) {
	cloud := azuresim.New(testSub, azuresim.Hooks{})
	p := simPlatform(cloud)
	ctx := t.Context()
	ws, other := t.TempDir(), t.TempDir()
	nodes := []provider.NodeSpec{{Name: "control-plane-0", Role: metadata.ControlPlane}, {Name: "worker-0", Role: metadata.Worker}}
	_, err := p.Create(ctx, provider.CreateRequest{Workspace: ws, Config: testConfig(variant.AzureSEVSNP), Nodes: nodes})
	require.NoError(t, err)
	otherConf := testConfig(variant.AzureSEVSNP)
	otherConf.Name = "other"
	_, err = p.Create(ctx, provider.CreateRequest{Workspace: other, Config: otherConf, Nodes: []provider.NodeSpec{{Name: "other-0", Role: metadata.ControlPlane}}})
	require.NoError(t, err)

	r, err := p.readRecord(ws)
	require.NoError(t, err)
	l, err := azuremeta.NewLister(testSub, "mini-rg", r.Layout.UID, azuresim.Credential, ClientOptions(cloud.Transport()))
	require.NoError(t, err)
	got, err := l.Instances(ctx)
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "control-plane-0", got[0].Name)
	assert.Equal(t, metadata.ControlPlane, got[0].Role)
	assert.Equal(t, metadata.Worker, got[1].Role)
	list, err := mustOpen(t, p, ws).Nodes(ctx)
	require.NoError(t, err)
	assert.Equal(t, list[1].IPs, got[1].IPs, "the addresses the CLI sees")
}

func mustNode(t *testing.T, prov provider.Provider, name string) provider.Node {
	t.Helper()
	nodes, err := prov.Nodes(t.Context())
	require.NoError(t, err)
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s", name)
	return provider.Node{}
}

func mustOpen(t *testing.T, p Platform, ws string) provider.Provider {
	t.Helper()
	prov, err := p.Open(ws)
	require.NoError(t, err)
	return prov
}

// TestKilledCreateIsFinishedByItsRerun: the CLI is killed in the middle of create (its
// context ends while the worker's VM is being asked for); the rerun adopts what the first run
// made and finishes, creating nothing twice.
func TestKilledCreateIsFinishedByItsRerun(t *testing.T) {
	cloud := azuresim.New(testSub, azuresim.Hooks{})
	ctx, kill := context.WithCancel(t.Context())
	p := simPlatform(cloud)
	p.Transport = &killAt{Transporter: cloud.Transport(), api: "VirtualMachinesClient.BeginCreateOrUpdate", nth: 2, kill: kill}
	ws := t.TempDir()
	nodes := []provider.NodeSpec{{Name: "control-plane-0", Role: metadata.ControlPlane}, {Name: "worker-0", Role: metadata.Worker}}

	_, err := p.Create(ctx, provider.CreateRequest{Workspace: ws, Config: testConfig(variant.AzureSEVSNP), Nodes: nodes})
	require.ErrorIs(t, err, context.Canceled)
	_, ok := cloud.VM("mini-rg", "worker-0")
	require.False(t, ok, "killed before the worker's VM")

	p = simPlatform(cloud)
	prov, err := p.Create(t.Context(), provider.CreateRequest{Workspace: ws, Config: testConfig(variant.AzureSEVSNP), Nodes: nodes})
	require.NoError(t, err)
	list, err := prov.Nodes(t.Context())
	require.NoError(t, err)
	assert.Len(t, list, 2)
	assert.Equal(t, 2, cloud.Count("DisksClient.BeginCreateOrUpdate"), "no disk made twice")
	assert.Equal(t, 2, cloud.Count("VirtualMachinesClient.BeginCreateOrUpdate"), "the control plane's VM is adopted: two VMs asked for, the killed call never reached Azure")
}

// killAt cancels the run when api is called the nth time, before the call reaches Azure.
type killAt struct {
	policy.Transporter
	api  string
	nth  int
	kill context.CancelFunc
}

func (k *killAt) Do(req *http.Request) (*http.Response, error) {
	if api, _ := req.Context().Value(runtime.CtxAPINameKey{}).(string); api == k.api && !strings.HasSuffix(req.URL.Path, "/get/fake/status") {
		k.nth--
		if k.nth == 0 {
			k.kill()
			return nil, req.Context().Err()
		}
	}
	return k.Transporter.Do(req)
}

// TestDialPathsOnTheSimulatedInternet follows the CLI's connections through the load
// balancer the host half made, with the simulated cloud's public address real on this host:
// the API endpoint to a control plane that answers, each node's ports through their NAT
// rules, nothing to a stopped cluster, and nothing once the cluster is removed.
func TestDialPathsOnTheSimulatedInternet(t *testing.T) {
	var mu sync.Mutex
	down := map[string]bool{} // "vm port" that does not answer
	cloud := azuresim.New(testSub, azuresim.Hooks{})
	stop := cloud.ServeInternet(func(_ context.Context, _, vm string, port int) (net.Conn, error) {
		name := vm + " " + strconv.Itoa(port)
		mu.Lock()
		defer mu.Unlock()
		if down[name] {
			return nil, errors.New("connection refused")
		}
		machine, conn := net.Pipe()
		go func() {
			defer machine.Close()
			_, _ = io.WriteString(machine, name+"\n")
		}()
		return conn, nil
	})
	t.Cleanup(stop)
	p := simPlatform(cloud)
	ws := t.TempDir()
	ctx := t.Context()
	_, err := p.Create(ctx, provider.CreateRequest{Workspace: ws, Config: testConfig(variant.AzureSEVSNP), Nodes: []provider.NodeSpec{
		{Name: "control-plane-0", Role: metadata.ControlPlane}, {Name: "control-plane-1", Role: metadata.ControlPlane}, {Name: "worker-0", Role: metadata.Worker},
	}})
	require.NoError(t, err)
	prov, err := p.Open(ws)
	require.NoError(t, err)
	ep, err := prov.Endpoints(ctx)
	require.NoError(t, err)
	api, err := netip.ParseAddrPort(ep.APIServer)
	require.NoError(t, err)
	assert.True(t, api.Addr().IsLoopback(), "the public address is this host's: %s", api)

	answer := func(dial func(context.Context, string, string) (net.Conn, error), addr string) string {
		t.Helper()
		conn, err := dial(ctx, "tcp", addr)
		if err != nil {
			return err.Error()
		}
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
		b, _ := io.ReadAll(conn)
		return strings.TrimSpace(string(b))
	}
	internet := (&net.Dialer{}).DialContext
	nat := func(ctx context.Context, _, addr string) (net.Conn, error) { return prov.Dialer()(ctx, addr) }
	apiAnswers := map[string]bool{}
	for range 4 {
		apiAnswers[answer(internet, ep.APIServer)] = true
	}
	assert.Equal(t, map[string]bool{"control-plane-0 6443": true, "control-plane-1 6443": true}, apiAnswers, "the API rule spreads over the control planes")
	mu.Lock()
	down["control-plane-0 6443"] = true
	mu.Unlock()
	for range 3 {
		assert.Equal(t, "control-plane-1 6443", answer(internet, ep.APIServer), "a control plane that does not answer gets no connections")
	}

	nodes, err := prov.Nodes(ctx)
	require.NoError(t, err)
	for _, n := range nodes {
		for _, port := range []int{provider.InitPort, provider.RecoverPort, provider.VerificationPort} {
			addr := net.JoinHostPort(n.IPs[0].String(), strconv.Itoa(port))
			assert.Equal(t, n.Name+" "+strconv.Itoa(port), answer(nat, addr), "the NAT rule of %s", addr)
		}
	}

	require.NoError(t, prov.Stop(ctx))
	assert.Empty(t, answer(internet, ep.APIServer), "a stopped cluster's load balancer has no backend")
	n, err := p.Remove(ctx, ws)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Contains(t, answer(internet, ep.APIServer), "connection refused", "a removed load balancer serves nothing")
}

// TestReportsOfAnEarlierBootDoNotCount: a serial log keeps what the node wrote before a
// restart until it reports again; once the provider asked for a boot, a report of an earlier
// boot is no report (recover and reboot would take it for the node being back).
func TestReportsOfAnEarlierBootDoNotCount(t *testing.T) {
	var mu sync.Mutex
	log := consoleReportAt("joined", time.Now().Add(-time.Hour))
	cloud := azuresim.New(testSub, azuresim.Hooks{Console: func(_, vm string) []byte {
		mu.Lock()
		defer mu.Unlock()
		return []byte(log)
	}})
	t.Cleanup(cloud.ServeBlobs())
	p := simPlatform(cloud)
	ws := t.TempDir()
	ctx := t.Context()
	_, err := p.Create(ctx, provider.CreateRequest{Workspace: ws, Config: testConfig(variant.AzureSEVSNP), Nodes: []provider.NodeSpec{{Name: "control-plane-0", Role: metadata.ControlPlane}}})
	require.NoError(t, err)
	prov, err := p.Open(ws)
	require.NoError(t, err)
	assert.Equal(t, "joined", mustNode(t, prov, "control-plane-0").Reported, "no boot asked for yet: the log's last report")

	require.NoError(t, prov.RebootNode(ctx, "control-plane-0"))
	assert.Empty(t, mustNode(t, prov, "control-plane-0").Reported, "the report is of the boot before the restart")
	mu.Lock()
	log += consoleReportAt("rejoined", time.Now())
	mu.Unlock()
	assert.Equal(t, "rejoined", mustNode(t, prov, "control-plane-0").Reported)

	// Stop and start: the same, for a node that rejoined five minutes before.
	mu.Lock()
	log = consoleReportAt("rejoined", time.Now().Add(-5*time.Minute))
	mu.Unlock()
	require.NoError(t, prov.Stop(ctx))
	require.NoError(t, prov.Start(ctx))
	assert.Equal(t, "running", cloud.Power("mini-rg", "control-plane-0"))
	assert.Empty(t, mustNode(t, prov, "control-plane-0").Reported)
}

// consoleReportAt is a report line of a boot at boot.
func consoleReportAt(phase string, boot time.Time) string {
	return azuremeta.ConsoleReport{Phase: phase, Boot: boot}.Line()
}

// TestSerialLogErrorsKeepTheLinkSecret: a serial log that cannot be read is named in the
// node's detail, without the link's signature.
func TestSerialLogErrorsKeepTheLinkSecret(t *testing.T) {
	cloud := azuresim.New(testSub, azuresim.Hooks{})
	stop := cloud.ServeBlobs()
	p := simPlatform(cloud)
	ws := t.TempDir()
	_, err := p.Create(t.Context(), provider.CreateRequest{Workspace: ws, Config: testConfig(variant.AzureSEVSNP), Nodes: []provider.NodeSpec{{Name: "control-plane-0", Role: metadata.ControlPlane}}})
	require.NoError(t, err)
	prov, err := p.Open(ws)
	require.NoError(t, err)
	assert.Empty(t, mustNode(t, prov, "control-plane-0").Detail, "an empty log")
	stop() // the storage endpoint goes away
	detail := mustNode(t, prov, "control-plane-0").Detail
	assert.Contains(t, detail, "reading the serial log of VM control-plane-0")
	assert.NotContains(t, detail, "sig=")
}
