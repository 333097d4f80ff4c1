package metaserver_test

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local/metadataclient"
	. "github.com/openconstellation/constellation/internal/provider/local/metaserver"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

func TestServeNodeByAddress(t *testing.T) {
	self := Node{Name: "worker-0", Role: "worker", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), CgroupRoot: "/cmini-x/worker-0/pods"}
	other := Node{Name: "control-plane-0", Role: "control-plane", IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}}
	srv := New([]Node{other, self}, []string{"10.42.0.10:30090"}, []byte(testHash))
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	c, err := metadataclient.New(ts.URL, nil)
	require.NoError(t, err)
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
	assert.Equal(t, []byte(testHash), hash)
	api, err := c.APIEndpoint(ctx)
	require.NoError(t, err)
	assert.Empty(t, api, "no load balancer set")
	srv.SetAPIEndpoint("10.42.0.2:6443")
	api, err = c.APIEndpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, "10.42.0.2:6443", api)

	// The node reports its phase; the provider reads it by name, until it clears it at a
	// boot. Malformed phases are refused.
	require.NoError(t, c.Report(ctx, "waiting-for-recovery"))
	assert.Equal(t, Report{Phase: "waiting-for-recovery"}, srv.Report("worker-0"))
	assert.Empty(t, srv.Report("control-plane-0"), "a report is the reporting node's own")
	for _, bad := range []string{"", "Waiting", "a b", "x\n", string(make([]byte, 65))} {
		assert.ErrorContains(t, c.Report(ctx, bad), "400", "%q", bad)
	}
	assert.Equal(t, Report{Phase: "waiting-for-recovery"}, srv.Report("worker-0"), "a refused report changes nothing")

	// A detail explains the phase. It is the node's text: the provider keeps one bounded
	// line without control characters.
	require.NoError(t, c.ReportDetail(ctx, metadata.PhaseTPMCannotQuote, "the TPM is in lockout; clears by 12:00"))
	assert.Equal(t, Report{Phase: metadata.PhaseTPMCannotQuote, Detail: "the TPM is in lockout; clears by 12:00"}, srv.Report("worker-0"))
	require.NoError(t, c.ReportDetail(ctx, metadata.PhaseTPMCannotQuote, strings.Repeat("\x1b[2J\r\n", 200)))
	got := srv.Report("worker-0").Detail
	assert.NotContains(t, got, "\x1b")
	assert.NotContains(t, got, "\n")
	assert.LessOrEqual(t, len(got), untrusted.MaxTextBytes+32)
	require.NoError(t, c.Report(ctx, "booting"))
	assert.Equal(t, Report{Phase: "booting"}, srv.Report("worker-0"), "a report without detail clears the detail")

	srv.ClearReport("worker-0")
	assert.Empty(t, srv.Report("worker-0"))

	// An address no node has gets nothing.
	srv.SetNodes([]Node{other}, nil)
	for name, call := range map[string]func() error{
		"self":      func() error { _, err := c.Self(ctx); return err },
		"instances": func() error { _, err := c.Instances(ctx); return err },
		"endpoints": func() error { _, err := c.JoinEndpoints(ctx); return err },
		"hash":      func() error { _, err := c.InitSecretHash(ctx); return err },
		"api":       func() error { _, err := c.APIEndpoint(ctx); return err },
		"report":    func() error { return c.Report(ctx, "booting") },
	} {
		err := call()
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "403", name)
	}
}

// testHash is a bcrypt hash (of "secret", cost 4): the client checks the format.
var testHash = func() string {
	h, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		panic(err)
	}
	return string(h)
}()
