package metaserver

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/metadata"
)

func TestServeNodeByAddress(t *testing.T) {
	self := Node{Name: "worker-0", Role: "worker", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), CgroupRoot: "/cmini-x/worker-0/pods"}
	other := Node{Name: "control-plane-0", Role: "control-plane", IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}}
	srv := New([]Node{other, self}, []string{"10.42.0.10:30090"}, []byte("$2a$10$hash"))
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	c := &Client{BaseURL: ts.URL}
	ctx := context.Background()

	n, err := c.Node(ctx)
	require.NoError(t, err)
	assert.Equal(t, self, n, "the node is told who it is by its source address")
	inst, err := c.Self(ctx)
	require.NoError(t, err)
	assert.Equal(t, metadata.Instance{Name: "worker-0", Role: metadata.Worker, IPs: self.IPs}, inst)
	all, err := c.Instances(ctx)
	require.NoError(t, err)
	assert.Len(t, all, 2)
	eps, err := c.JoinEndpoints(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"10.42.0.10:30090"}, eps)
	hash, err := c.InitSecretHash(ctx)
	require.NoError(t, err)
	assert.Equal(t, []byte("$2a$10$hash"), hash)

	// An address no node has gets nothing.
	srv.SetNodes([]Node{other}, nil)
	for name, call := range map[string]func() error{
		"self":      func() error { _, err := c.Self(ctx); return err },
		"instances": func() error { _, err := c.Instances(ctx); return err },
		"endpoints": func() error { _, err := c.JoinEndpoints(ctx); return err },
		"hash":      func() error { _, err := c.InitSecretHash(ctx); return err },
	} {
		err := call()
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "403", name)
	}
}
