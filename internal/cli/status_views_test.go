package cli

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
)

// Each view runs with its own deadline; one that answers is merged, one that hangs (even
// ignoring its context) becomes a note naming who did not answer, and the gathering does not
// wait for it.
func TestGatherViews(t *testing.T) {
	const deadline = 200 * time.Millisecond
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var mu sync.Mutex
	deadlines := map[string]time.Duration{}
	record := func(name string, ctx context.Context) {
		d, ok := ctx.Deadline()
		require.True(t, ok, "%s: the view's context has a deadline", name)
		mu.Lock()
		deadlines[name] = time.Until(d)
		mu.Unlock()
	}
	views := []statusView{
		{name: "fast", what: "the fast one", run: func(ctx context.Context) func(*statusReport, map[string]*nodeStatus) {
			record("fast", ctx)
			return func(r *statusReport, _ map[string]*nodeStatus) { r.Errors = append(r.Errors, "fast answered") }
		}},
		{name: "hung", what: "the provider that hangs", run: func(ctx context.Context) func(*statusReport, map[string]*nodeStatus) {
			record("hung", ctx)
			<-release // ignores its context
			return func(r *statusReport, _ map[string]*nodeStatus) { r.Errors = append(r.Errors, "hung answered") }
		}},
		{name: "polite", what: "the API server", run: func(ctx context.Context) func(*statusReport, map[string]*nodeStatus) {
			record("polite", ctx)
			<-ctx.Done()
			return func(r *statusReport, _ map[string]*nodeStatus) {
				r.Errors = append(r.Errors, "polite: "+ctx.Err().Error())
			}
		}},
	}
	merges, notes := gatherViews(context.Background(), deadline, views)
	r := &statusReport{}
	for _, m := range merges {
		m(r, nil)
	}
	r.Errors = append(r.Errors, notes...)
	assert.Contains(t, r.Errors, "fast answered")
	assert.Contains(t, r.Errors, "hung: no answer within 200ms: the provider that hangs did not answer")
	assert.NotContains(t, r.Errors, "hung answered")
	// The view that honours its context either answered with its error or was cut off: both
	// name it.
	assert.True(t, strings.Contains(strings.Join(r.Errors, "\n"), "polite"), "%v", r.Errors)
	mu.Lock()
	defer mu.Unlock()
	for name, d := range deadlines {
		assert.LessOrEqual(t, d, deadline, "%s", name)
		assert.Positive(t, d, "%s", name)
	}
}

// hungPlatform is a platform whose API accepts and never answers: Nodes blocks until the test
// ends, ignoring its context, and records the context's deadline.
type hungPlatform struct {
	provider.Provider
	release  chan struct{}
	deadline chan time.Time
}

func (p *hungPlatform) Nodes(ctx context.Context) ([]provider.Node, error) {
	d, _ := ctx.Deadline()
	p.deadline <- d
	<-p.release
	return nil, nil
}

// hungListener accepts connections and never answers (an API server that hangs).
func hungListener(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// hungWorkspace is a workspace of an initialized cluster whose API server hangs.
func hungWorkspace(t testing.TB) (string, *state.State) {
	ws := t.TempDir()
	api := hungListener(t)
	now := time.Now().UTC()
	st := &state.State{
		Version: state.Version1, Name: "demo", Provider: state.ProviderLocal, Phase: state.Initialized,
		CreatedAt: now, InitializedAt: now, InitEndpoint: "10.42.0.10:9000", APIServerEndpoint: api,
		ClusterID: make([]byte, 32), MeasurementSalt: make([]byte, 32),
		Nodes: []state.Node{{Name: "control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}}},
	}
	require.NoError(t, state.Write(filepath.Join(ws, state.FileName), st))
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://" + api, InsecureSkipTLSVerify: true}
	kubeconfig.AuthInfos["a"] = &clientcmdapi.AuthInfo{Token: "t"}
	kubeconfig.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "a"}
	kubeconfig.CurrentContext = "x"
	require.NoError(t, clientcmd.WriteToFile(*kubeconfig, filepath.Join(ws, AdminConfFile)))
	return ws, st
}

// status with an API server that accepts and never answers and a platform that hangs: it
// returns, each view with its own deadline, and names what did not answer.
func TestStatusWithHungViews(t *testing.T) {
	ws, st := hungWorkspace(t)
	platform := &hungPlatform{release: make(chan struct{}), deadline: make(chan time.Time, 1)}
	t.Cleanup(func() { close(platform.release) })
	const budget = 500 * time.Millisecond
	start := time.Now()
	r, err := statusOf(context.Background(), ws, st, platform, true, budget)
	require.NoError(t, err)

	d := <-platform.deadline
	assert.False(t, d.IsZero(), "the platform view has a deadline")
	assert.False(t, d.After(start.Add(budget)), "within the budget")
	errs := strings.Join(r.Errors, "\n")
	assert.Contains(t, errs, "platform: no answer within 250ms: the platform (local provider) did not answer")
	// The API server's views: cut off at the deadline, or failed with it.
	for _, view := range []string{"kubernetes: ", "disks: "} {
		assert.Contains(t, errs, view, "%v", r.Errors)
	}
	assert.Regexp(t, `kubernetes: (no answer within 250ms: the Kubernetes API server at 127\.0\.0\.1:\d+ did not answer|listing nodes: .*(deadline exceeded|Timeout))`, errs)
	// Not even the attestation view's configuration is there: its error is a note too.
	assert.Contains(t, errs, "attestation: ")
	_, statErr := os.Stat(filepath.Join(ws, state.FileName))
	require.NoError(t, statErr)
}

// BenchmarkStatusWithHungViews measures status against an API server that accepts and never
// answers and a platform that hangs, with the default budget: what an operator waits when
// everything is down. docs/benchmarks.md has the figure.
func BenchmarkStatusWithHungViews(b *testing.B) {
	ws, st := hungWorkspace(b)
	platform := &hungPlatform{release: make(chan struct{}), deadline: make(chan time.Time, b.N+1)}
	b.Cleanup(func() { close(platform.release) })
	var worst time.Duration
	for b.Loop() {
		start := time.Now()
		r, err := statusOf(context.Background(), ws, st, platform, true, DefaultStatusTimeout)
		require.NoError(b, err)
		require.NotEmpty(b, r.Errors)
		worst = max(worst, time.Since(start))
	}
	b.ReportMetric(worst.Seconds(), "worst-s")
}
