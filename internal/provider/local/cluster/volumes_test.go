package cluster

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local/metaserver"
	"github.com/openconstellation/constellation/internal/provider/local/volumestore"
)

// TestOpenVolumes: the provider keeps volumes in Dir/volumes, serves them through the
// metadata service, and at its start releases the attachments of nodes its spec no longer has
// (a provider killed between deleting a node and releasing its volumes).
func TestOpenVolumes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	held, gone := csidriver.IDFor("pvc-held"), csidriver.IDFor("pvc-gone")
	before, err := volumestore.Open(filepath.Join(dir, VolumesDir))
	require.NoError(t, err)
	for id, node := range map[string]string{held: "worker-0", gone: "worker-1"} {
		_, err := before.Create(ctx, id, 1<<20)
		require.NoError(t, err)
		require.NoError(t, before.Attach(ctx, id, node))
	}

	p := &Provider{spec: Spec{Dir: dir, Nodes: []NodeSpec{
		{NodeSpec: provider.NodeSpec{Name: "control-plane-0", Role: "control-plane"}, Index: 0},
		{NodeSpec: provider.NodeSpec{Name: "worker-0", Role: "worker"}, Index: 2},
	}}}
	p.meta = metaserver.New([]metaserver.Node{
		{Name: "control-plane-0", Role: "control-plane", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
	}, nil, nil)
	require.NoError(t, p.openVolumes())

	v, err := p.volumes.Get(ctx, held)
	require.NoError(t, err)
	assert.Equal(t, "worker-0", v.AttachedTo, "a node the cluster has keeps its volume")
	v, err = p.volumes.Get(ctx, gone)
	require.NoError(t, err)
	assert.Empty(t, v.AttachedTo, "a deleted node's volume is released")

	ts := httptest.NewServer(p.meta.Handler())
	t.Cleanup(ts.Close)
	resp, err := http.Get(ts.URL + "/v1/volumes/" + gone)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the metadata service serves the store")
}
