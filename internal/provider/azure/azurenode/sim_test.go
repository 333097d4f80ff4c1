package azurenode

import (
	"bytes"
	"net"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/metadata"
	hosthalf "github.com/openconstellation/constellation/internal/provider/azure"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim/simcluster"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

const simSub = "00000000-0000-0000-0000-0000000000bb"

// TestOnTheVMsTheHostHalfMade runs the node half's metadata (what the bootstrapper asks on
// Azure) on the VMs the host half created in a simulated subscription, each reading its own
// VM's IMDS (azuresim's, from the same state) and listing the cluster through Resource
// Manager: the two halves agree on the tags, the addresses and the init secret.
func TestOnTheVMsTheHostHalfMade(t *testing.T) {
	sim := simcluster.New(t, simSub)
	cloud, host, ws := sim.Cloud, sim.Platform, sim.Workspace
	ctx := t.Context()
	prov, err := host.Open(ws)
	require.NoError(t, err)
	nodes, err := prov.Nodes(ctx)
	require.NoError(t, err)
	require.Len(t, nodes, 2)
	endpoints, err := prov.Endpoints(ctx)
	require.NoError(t, err)
	secret, err := host.InitSecret(ws)
	require.NoError(t, err)

	for _, n := range nodes {
		t.Run(n.Name, func(t *testing.T) {
			m := simNode(t, cloud, n.Name)
			self, err := m.Self(ctx)
			require.NoError(t, err)
			assert.Equal(t, metadata.Instance{Name: n.Name, Role: n.Role, IPs: n.IPs}, self)
			api, err := m.APIEndpoint(ctx)
			require.NoError(t, err)
			assert.Equal(t, endpoints.ClusterAPIServer, api)
			joins, err := m.JoinEndpoints(ctx)
			require.NoError(t, err)
			assert.Equal(t, []string{net.JoinHostPort(nodes[0].IPs[0].String(), strconv.Itoa(deploy.JoinServicePort))}, joins, "the control plane's join service")

			hash, err := m.InitSecretHash(ctx)
			if n.Role == metadata.Worker {
				assert.Error(t, err, "a worker is never initialized")
				return
			}
			require.NoError(t, err)
			assert.NoError(t, bcrypt.CompareHashAndPassword(hash, secret), "the node checks the CLI's secret against the hash the host half tagged")
		})
	}

	// The state disk at the LUN the node opens it at; a volume at a volume's LUN.
	inst, err := (azuremeta.IMDS{BaseURL: cloud.ServeIMDS(t, "mini-rg", "worker-0")}).ClusterInstance(ctx)
	require.NoError(t, err)
	assert.Equal(t, []azuremeta.DataDisk{{Name: "worker-0-state", LUN: azuremeta.StateLUN}}, inst.DataDisks)
	assert.Equal(t, simSub, inst.Subscription)
	assert.Equal(t, "mini-rg", inst.ResourceGroup)
}

// TestIMDSRefusesWhatAzureRefuses: the simulated IMDS answers as Azure's does a request
// without the Metadata header, through a proxy, or for a VM that is gone.
func TestIMDSRefusesWhatAzureRefuses(t *testing.T) {
	cloud := azuresim.New(simSub, azuresim.Hooks{})
	_, err := (azuremeta.IMDS{BaseURL: cloud.ServeIMDS(t, "mini-rg", "worker-0")}).Instance(t.Context())
	assert.ErrorContains(t, err, "IMDS answered 404", "no such VM")
	for name, header := range map[string][2]string{"no Metadata header": {"Metadata", ""}, "proxied": {"X-Forwarded-For", "10.0.0.1"}} {
		req := httptest.NewRequest("GET", "/metadata/instance?api-version=2021-02-01", nil)
		req.Header.Set("Metadata", "true")
		req.Header.Set(header[0], header[1])
		rec := httptest.NewRecorder()
		cloud.IMDS("mini-rg", "worker-0").ServeHTTP(rec, req)
		assert.Equal(t, 400, rec.Code, name)
	}
}

// simNode is the metadata the platform gives the bootstrapper on VM name, its IMDS the
// simulated cloud's and its lister reaching the simulated Resource Manager with a token of
// the VM's nodes' identity, which the VM's IMDS issues: the role the host half gave that
// identity must allow the listing.
func simNode(t *testing.T, cloud *azuresim.Cloud, name string) boot.Metadata {
	t.Helper()
	url := cloud.ServeIMDS(t, "mini-rg", name)
	p := newPlatform(boot.PlatformConfig{MetadataURL: url}, variant.AzureSEVSNP, &bytes.Buffer{}, time.Now())
	lister := azuremeta.NewClusterLister(url)
	lister.Options = hosthalf.ClientOptions(cloud.TransportFrom("mini-rg", name))
	p.meta.lister = lister
	m, err := p.Metadata(t.Context())
	require.NoError(t, err)
	return m
}
