package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
)

// helloService runs the availability workload: Deployment hello (3 replicas, each answering
// with its pod name, a readiness probe every second), PodDisruptionBudget hello (at least 2
// available, so a drain evicts one replica at a time) and Service hello (NodePort). It returns
// the node port.
func helloService(t *testing.T, kubeconfig, images string) int {
	t.Helper()
	applyManifest(t, kubeconfig, fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: hello, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: hello-deployment}}
  template:
    metadata: {labels: {app: hello-deployment}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: hello
        image: %s
        imagePullPolicy: Never
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {port: 8080, path: /}, periodSeconds: 1}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: hello, namespace: default}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: hello-deployment}}
---
apiVersion: v1
kind: Service
metadata: {name: hello, namespace: default}
spec:
  type: NodePort
  selector: {app: hello-deployment}
  ports: [{port: 80, targetPort: 8080}]
`, helloRef(t, images)))
	kubectl(t, kubeconfig, "rollout", "status", "deployment/hello", "--timeout=180s")
	port, err := strconv.Atoi(kubectl(t, kubeconfig, "get", "service", "hello", "-o", "jsonpath={.spec.ports[0].nodePort}"))
	require.NoError(t, err)
	return port
}

// poll counts the answers of one polled endpoint.
type poll struct {
	name     string
	every    time.Duration
	mu       sync.Mutex
	requests int
	failures []string // "<time since start>: <error>", the first 20
	failed   int
}

func (p *poll) record(start time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	if err == nil {
		return
	}
	p.failed++
	if len(p.failures) < 20 {
		p.failures = append(p.failures, fmt.Sprintf("%.1fs: %v", time.Since(start).Seconds(), err))
	}
}

func (p *poll) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("%s every %v: %d requests, %d failed %v", p.name, p.every, p.requests, p.failed, p.failures)
}

// availability polls a cluster from outside while an operation runs: the Kubernetes API every
// 500 ms through the admin kubeconfig (the platform's API endpoint, as every client), and
// Service hello every 100 ms through its node port. The Service's poller is a client of a
// load balancer with health checks, as a cloud's is: it asks the nodes the state file lists,
// the one that answered last first, and a request fails only if no node answers within the
// poll interval. Each request is bounded, so a hung request counts as failed.
type availability struct {
	api, service *poll
	cancel       context.CancelFunc
	done         sync.WaitGroup
}

func startAvailability(t *testing.T, ws, kubeconfig string, nodePort int) *availability {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	rc.Timeout = 2 * time.Second
	client, err := kubernetes.NewForConfig(rc)
	require.NoError(t, err)
	dialer := (&cluster.Local{Dir: filepath.Join(ws, "mini")}).Dialer()
	httpClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return dialer(ctx, addr) }}}

	// kube-proxy programs the node port a moment after the Service exists: the pollers
	// start once it answers.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, ip := range nodeIPs(ws, "") {
			assert.NoError(c, getHello(ctx, httpClient, net.JoinHostPort(ip, strconv.Itoa(nodePort))))
		}
	}, time.Minute, 200*time.Millisecond, "Service hello answers on every node's port")

	ctx, cancel := context.WithCancel(context.Background())
	a := &availability{api: &poll{name: "API", every: 500 * time.Millisecond}, service: &poll{name: "Service hello", every: 100 * time.Millisecond}, cancel: cancel}
	start := time.Now()
	a.done.Add(2)
	go a.run(ctx, a.api, func(ctx context.Context) error {
		_, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err
	}, start)
	last := ""
	go a.run(ctx, a.service, func(ctx context.Context) error {
		var errs []string
		for _, ip := range nodeIPs(ws, last) {
			if err := getHello(ctx, httpClient, net.JoinHostPort(ip, strconv.Itoa(nodePort))); err != nil {
				errs = append(errs, err.Error())
				continue
			}
			last = ip
			return nil
		}
		return fmt.Errorf("no node answered: %s", strings.Join(errs, "; "))
	}, start)
	t.Cleanup(a.stop)
	return a
}

func (a *availability) run(ctx context.Context, p *poll, request func(context.Context) error, start time.Time) {
	defer a.done.Done()
	ticker := time.NewTicker(p.every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := request(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.record(start, err)
	}
}

func (a *availability) stop() {
	a.cancel()
	a.done.Wait()
}

// requireNoFailures stops the pollers and fails the test if a request failed, logging the
// counts either way.
func (a *availability) requireNoFailures(t *testing.T) {
	t.Helper()
	a.stop()
	t.Logf("availability: %s; %s", a.api, a.service)
	require.Zero(t, a.api.failed, "%s", a.api)
	require.Zero(t, a.service.failed, "%s", a.service)
	require.NotZero(t, a.api.requests)
	require.NotZero(t, a.service.requests)
}

// nodeIPs are the addresses of the nodes the workspace's state file lists, first one first.
func nodeIPs(ws, first string) []string {
	st, err := state.Load(filepath.Join(ws, state.FileName))
	if err != nil {
		return []string{first}
	}
	ips := []string{}
	if first != "" {
		ips = append(ips, first)
	}
	for _, n := range st.Nodes {
		if ip := n.IPs[0].String(); ip != first {
			ips = append(ips, ip)
		}
	}
	return ips
}

func getHello(ctx context.Context, c *http.Client, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "hello from ") {
		return fmt.Errorf("%s: %s %q", addr, resp.Status, body)
	}
	return nil
}
