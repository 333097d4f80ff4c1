package e2e

import (
	"context"
	"encoding/json"
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
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
)

// The availability measurements of the e2e tests (TestAPIEndpoint, TestUpgrade): while an
// operation runs, pollers count every request to the Kubernetes API (every 500 ms, client-go
// through the admin kubeconfig from the host, as the CLI reaches it) and to a workload's
// Service (every 100 ms, asked the way the test says), and every request must succeed. A
// request fails when it is not answered within 10 s (a request may be slow while etcd changes
// members).

// pollers count requests to the API and to a Service until stopped.
type pollers struct {
	stop    func()
	wg      sync.WaitGroup
	start   time.Time
	service string // the Service's name and how it is asked, for the log
	asked   string
	api     pollCount
	web     pollCount
	// slices records the Service's EndpointSlice changes, to tell a failure's cause.
	slicesMu sync.Mutex
	slices   []string
}

// pollCount is one poller's tally; failures keep their first few messages.
type pollCount struct {
	mu                 sync.Mutex
	requests, failures int
	firstFailures      []string
}

func (c *pollCount) record(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests++
	if err != nil {
		c.failures++
		if len(c.firstFailures) < 10 {
			c.firstFailures = append(c.firstFailures, time.Now().Format("15:04:05.000")+" "+err.Error())
		}
	}
}

// startPollers polls the API every 500 ms and Service service every 100 ms with ask (asked
// says how, for the log) until requireNoFailures.
func startPollers(t *testing.T, kubeconfig, service, asked string, ask func(context.Context) error) *pollers {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	cfg.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	p := &pollers{stop: cancel, start: time.Now(), service: service, asked: asked}
	p.wg.Go(func() { p.watchSlices(ctx, client) })
	every := func(interval time.Duration, c *pollCount, req func(context.Context) error) {
		p.wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				err := req(rctx)
				rcancel()
				if ctx.Err() != nil {
					return
				}
				c.record(err)
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	every(500*time.Millisecond, &p.api, func(ctx context.Context) error {
		_, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	every(100*time.Millisecond, &p.web, ask)
	t.Cleanup(p.stopNow)
	return p
}

// watchSlices records every change of the Service's EndpointSlices: time, and each
// endpoint's address, node and conditions.
func (p *pollers) watchSlices(ctx context.Context, client kubernetes.Interface) {
	for ctx.Err() == nil {
		w, err := client.DiscoveryV1().EndpointSlices("default").Watch(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + p.service})
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			es, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			var eps []string
			for _, e := range es.Endpoints {
				node := ""
				if e.NodeName != nil {
					node = *e.NodeName
				}
				eps = append(eps, fmt.Sprintf("%v@%s ready=%v serving=%v terminating=%v", e.Addresses, node,
					deref(e.Conditions.Ready), deref(e.Conditions.Serving), deref(e.Conditions.Terminating)))
			}
			p.slicesMu.Lock()
			p.slices = append(p.slices, fmt.Sprintf("%s %s %s: %s", time.Now().Format("15:04:05.000"), ev.Type, es.Name, strings.Join(eps, "; ")))
			p.slicesMu.Unlock()
		}
		w.Stop()
	}
}

func deref(b *bool) bool { return b != nil && *b }

func (p *pollers) stopNow() {
	p.stop()
	p.wg.Wait()
}

// requireNoFailures stops the pollers, logs their counts and fails if any request failed.
func (p *pollers) requireNoFailures(t *testing.T) {
	t.Helper()
	p.stopNow()
	p.slicesMu.Lock()
	t.Logf("polled from %s to %s; Service %s's EndpointSlice changes:\n%s", p.start.Format("15:04:05.000"), time.Now().Format("15:04:05.000"), p.service, strings.Join(p.slices, "\n"))
	p.slicesMu.Unlock()
	for _, c := range []struct {
		what string
		n    *pollCount
	}{{"API (every 500 ms, from the host through the admin kubeconfig)", &p.api}, {"Service " + p.service + " (every 100 ms, " + p.asked + ")", &p.web}} {
		data, _ := json.Marshal(c.n.firstFailures)
		t.Logf("%s: %d requests, %d failures %s", c.what, c.n.requests, c.n.failures, data)
		assert.Positive(t, c.n.requests, c.what)
		assert.Zero(t, c.n.failures, "%s: first failures: %s", c.what, data)
	}
}

// helloService runs the workload of the upgrade test: Deployment hello (3 replicas, each
// answering with its pod name, a readiness probe every second), PodDisruptionBudget hello (at
// least 2 available, so a drain evicts one replica at a time) and Service hello (NodePort). It
// returns the node port.
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

// askNodePort returns how the upgrade test asks Service hello: as the client of a load
// balancer with health checks, as a cloud's is, it asks the nodes the state file lists (they
// change during an upgrade), the one that answered last first, and a request fails only if no
// node answers. It waits (a minute at most) until every node's port answers: kube-proxy
// programs a node port a moment after the Service exists.
func askNodePort(t *testing.T, ws string, nodePort int) func(context.Context) error {
	t.Helper()
	dialer := (&cluster.Local{Dir: filepath.Join(ws, "mini")}).Dialer()
	httpClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return dialer(ctx, addr) }}}
	port := strconv.Itoa(nodePort)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, ip := range nodeIPs(ws, "") {
			assert.NoError(c, getHello(ctx, httpClient, net.JoinHostPort(ip, port)))
		}
	}, time.Minute, 200*time.Millisecond, "Service hello answers on every node's port")
	last := ""
	return func(ctx context.Context) error {
		var errs []string
		for _, ip := range nodeIPs(ws, last) {
			if err := getHello(ctx, httpClient, net.JoinHostPort(ip, port)); err != nil {
				errs = append(errs, err.Error())
				continue
			}
			last = ip
			return nil
		}
		return fmt.Errorf("no node answered: %s", strings.Join(errs, "; "))
	}
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
