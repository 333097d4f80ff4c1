package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
)

// The availability measurements of the e2e tests (TestAPIEndpoint, TestUpgrade) and of
// BenchmarkUpgrade: while an operation runs, pollers ask targets at a fixed interval (the
// Kubernetes API every 500 ms, client-go through the admin kubeconfig from the host, as the CLI
// reaches it; a workload's Service every 100 ms, asked the way the test says; optionally the
// API's /readyz) and count every request; every request must succeed. A request fails when it
// is not answered within its target's timeout (10 s for the API: a request may be slow while
// etcd changes members).
//
// Each failure is recorded with its reason (failureKind: timeout, refused, reset, closed
// without an answer, an HTTP status, an API error) and with how long the polling process itself
// was stalled while the request ran (stallMonitor): a request that timed out while the poller
// could not run is the client starving, not the cluster failing, and the log says which.

// target is one thing the pollers ask: how, how often and how long one request may take.
type target struct {
	what    string // for the log: what is asked and how
	every   time.Duration
	timeout time.Duration
	ask     func(context.Context) error
}

// apiTarget asks the API for a namespace every 500 ms through the admin kubeconfig (client-go,
// kept connections).
func apiTarget(client kubernetes.Interface) target {
	return target{what: "API (every 500 ms, from the host through the admin kubeconfig)", every: 500 * time.Millisecond, timeout: 10 * time.Second,
		ask: func(ctx context.Context) error {
			_, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
			return err
		}}
}

// readyzTarget asks the API's /readyz every 500 ms with a 2 s timeout, as a health checker
// (a load balancer's, a monitoring probe) would.
func readyzTarget(client kubernetes.Interface) target {
	return target{what: "API /readyz (every 500 ms, 2 s timeout)", every: 500 * time.Millisecond, timeout: 2 * time.Second,
		ask: func(ctx context.Context) error {
			return client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
		}}
}

// serviceTarget asks a Service every 100 ms with ask; asked says how, for the log.
func serviceTarget(service, asked string, ask func(context.Context) error) target {
	return target{what: "Service " + service + " (every 100 ms, " + asked + ")", every: 100 * time.Millisecond, timeout: 10 * time.Second, ask: ask}
}

// pollers count requests to their targets until stopped.
type pollers struct {
	stop    func()
	wg      sync.WaitGroup
	start   time.Time
	service string // the Service whose EndpointSlices are recorded
	counts  []*pollCount
	stalls  *stallMonitor
	// slices records the Service's EndpointSlice changes, to tell a failure's cause.
	slicesMu sync.Mutex
	slices   []string
}

// pollCount is one target's tally; failures keep their first few records, and every
// failure is counted by reason.
type pollCount struct {
	what               string
	mu                 sync.Mutex
	requests, failures int
	// starved counts the failures during which the poller itself was kept from running for at
	// least half of the request's timeout.
	starved       int
	byKind        map[string]int
	firstFailures []string
}

func (c *pollCount) record(start time.Time, took, timeout, stalled, ioStalled time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests++
	if err == nil {
		return
	}
	c.failures++
	kind := failureKind(err)
	if stalled >= timeout/2 {
		c.starved++
		kind += " (poller stalled)"
	}
	if c.byKind == nil {
		c.byKind = map[string]int{}
	}
	c.byKind[kind]++
	if len(c.firstFailures) < 10 {
		c.firstFailures = append(c.firstFailures, fmt.Sprintf("%s %s after %v, poller stalled %v, machine stalled on I/O %v: %v",
			start.Format("15:04:05.000"), kind, took.Round(time.Millisecond), stalled.Round(time.Millisecond), ioStalled.Round(time.Millisecond), err))
	}
}

// failureKind names why a request failed, from the error's chain: what the failure says about
// where the request was lost.
func failureKind(err error) string {
	var status apiStatus
	var httpErr *httpStatusError
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "closed without an answer"
	case errors.As(err, &httpErr):
		return fmt.Sprintf("HTTP %d", httpErr.code)
	case errors.As(err, &status):
		return fmt.Sprintf("API %d %s", status.Status().Code, status.Status().Reason)
	}
	return "other"
}

// apiStatus is what client-go's API errors are (apierrors.APIStatus).
type apiStatus interface{ Status() metav1.Status }

// httpStatusError is an answer that was not the expected one.
type httpStatusError struct {
	code int
	msg  string
}

func (e *httpStatusError) Error() string { return e.msg }

// stallMonitor measures how late a 10 ms sleep of the polling process wakes up: under CPU
// load the poller may not run for a while, and a request that times out then was lost by the
// client, not the cluster. It keeps every wake-up 5 ms or more late; a request's stall is the
// sum of those within it (many short waits for a CPU add up as one long one would).
type stallMonitor struct {
	mu     sync.Mutex
	stalls []stall
}

type stall struct {
	at   time.Time // when the late sleep ended
	late time.Duration
}

const stallTick = 10 * time.Millisecond

func (m *stallMonitor) run(ctx context.Context) {
	for ctx.Err() == nil {
		before := time.Now()
		time.Sleep(stallTick)
		if late := time.Since(before) - stallTick; late >= 5*time.Millisecond {
			m.mu.Lock()
			m.stalls = append(m.stalls, stall{at: time.Now(), late: late})
			m.mu.Unlock()
		}
	}
}

// during is how long the poller was kept from running within [from, to]: the lateness of
// every wake-up that overlapped it, clipped to it.
func (m *stallMonitor) during(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sum time.Duration
	for _, s := range m.stalls {
		start, end := s.at.Add(-s.late), s.at
		if end.Before(from) || start.After(to) {
			continue
		}
		if to.Before(end) {
			end = to
		}
		if start.Before(from) {
			start = from
		}
		sum += end.Sub(start)
	}
	return sum
}

// summary is the number of wake-ups 50 ms or more late and the latest of all.
func (m *stallMonitor) summary() (n int, longest time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.stalls {
		if s.late >= 50*time.Millisecond {
			n++
		}
		longest = max(longest, s.late)
	}
	return n, longest
}

// ioFullStall is the machine's total time in which every runnable task waited for I/O (the
// kernel's pressure stall information, /proc/pressure/io "full"); 0 where the kernel has none.
func ioFullStall() time.Duration {
	data, err := os.ReadFile("/proc/pressure/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "full ") {
			continue
		}
		_, total, ok := strings.Cut(line, "total=")
		if !ok {
			return 0
		}
		us, err := strconv.ParseInt(strings.TrimSpace(total), 10, 64)
		if err != nil {
			return 0
		}
		return time.Duration(us) * time.Microsecond
	}
	return 0
}

// startPollers polls the API every 500 ms and Service service every 100 ms with ask (asked
// says how, for the log) until requireNoFailures.
func startPollers(t *testing.T, kubeconfig, service, asked string, ask func(context.Context) error) *pollers {
	t.Helper()
	return pollTargets(t, kubeconfig, service, apiTarget(adminClient(t, kubeconfig)), serviceTarget(service, asked, ask))
}

// pollTargets polls every target until stopped (requireNoFailures, or the test's end), and
// records the EndpointSlice changes of Service service.
func pollTargets(t testing.TB, kubeconfig, service string, targets ...target) *pollers {
	t.Helper()
	client := adminClient(t, kubeconfig)
	ctx, cancel := context.WithCancel(context.Background())
	p := &pollers{stop: cancel, start: time.Now(), service: service, stalls: &stallMonitor{}}
	p.wg.Go(func() { p.stalls.run(ctx) })
	p.wg.Go(func() { p.watchSlices(ctx, client) })
	for _, tg := range targets {
		c := &pollCount{what: tg.what}
		p.counts = append(p.counts, c)
		p.wg.Go(func() {
			tick := time.NewTicker(tg.every)
			defer tick.Stop()
			for {
				rctx, rcancel := context.WithTimeout(ctx, tg.timeout)
				ioBefore := ioFullStall()
				start := time.Now()
				err := tg.ask(rctx)
				took := time.Since(start)
				rcancel()
				if ctx.Err() != nil {
					return
				}
				c.record(start, took, tg.timeout, p.stalls.during(start, start.Add(took)), ioFullStall()-ioBefore, err)
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
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

// report stops the pollers and logs the EndpointSlice changes, the poller's stalls and each
// target's counts, failures by reason and first failures.
func (p *pollers) report(t testing.TB) {
	t.Helper()
	p.stopNow()
	p.slicesMu.Lock()
	t.Logf("polled from %s to %s; Service %s's EndpointSlice changes:\n%s", p.start.Format("15:04:05.000"), time.Now().Format("15:04:05.000"), p.service, strings.Join(p.slices, "\n"))
	p.slicesMu.Unlock()
	n, longest := p.stalls.summary()
	t.Logf("the poller stalled %d times for 50 ms or more, longest %v", n, longest.Round(time.Millisecond))
	for _, c := range p.counts {
		data, _ := json.Marshal(c.firstFailures)
		t.Logf("%s: %d requests, %d failures (%d while the poller stalled) by reason %v; first: %s", c.what, c.requests, c.failures, c.starved, c.byKind, data)
	}
}

// requireNoFailures stops the pollers, logs what they saw and fails if any request failed.
func (p *pollers) requireNoFailures(t *testing.T) {
	t.Helper()
	p.report(t)
	for _, c := range p.counts {
		assert.Positive(t, c.requests, c.what)
		assert.Zero(t, c.failures, "%s: first failures: %s", c.what, c.firstFailures)
	}
}

// helloService runs the workload of the upgrade test: Deployment hello (3 replicas, each
// answering with its pod name, a readiness probe every second), PodDisruptionBudget hello (at
// least 2 available, so a drain evicts one replica at a time) and Service hello of type
// serviceType (NodePort or LoadBalancer). It returns the node port.
func helloService(t testing.TB, kubeconfig, images, serviceType string) int {
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
  type: %s
  selector: {app: hello-deployment}
  ports: [{port: 80, targetPort: 8080}]
`, helloRef(t, images), serviceType))
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
	return getHelloWith(ctx, c, addr)
}

// getHelloWith asks hello at addr once, within ctx.
func getHelloWith(ctx context.Context, c *http.Client, addr string) error {
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
		return &httpStatusError{code: resp.StatusCode, msg: fmt.Sprintf("%s: %s %q", addr, resp.Status, body)}
	}
	return nil
}

// askLoadBalancer returns how BenchmarkUpgrade asks Service hello: from the host through its
// LoadBalancer address (the local provider's host load balancer, port 80), a new connection
// each time, 2 s per request. It waits (a minute at most) until the Service has its address and
// answers.
func askLoadBalancer(t testing.TB, kubeconfig string) func(context.Context) error {
	t.Helper()
	bin := kubectlPath(t)
	var ip string
	require.Eventually(t, func() bool {
		ip = kubectlQuiet(bin, kubeconfig, "get", "service", "hello", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}")
		return ip != ""
	}, time.Minute, time.Second, "Service hello gets its LoadBalancer address")
	addr := net.JoinHostPort(ip, "80")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	ask := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return getHelloWith(ctx, client, addr)
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.NoError(c, ask(context.Background())) },
		time.Minute, 200*time.Millisecond, "Service hello answers at %s", addr)
	return ask
}
