package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
)

// TestAPIEndpoint checks the cluster's stable API endpoint, the local provider's load
// balancer, and measures that no client sees downtime while control-plane-0 goes away: in a
// cluster of three control planes and a worker, `reboot control-plane-0` (drained, shut down
// in order, back, uncordoned) and then `apply --remove control-plane-0` (3 → 2 control
// planes, control-plane-0 removed) run while two pollers count every request:
//
//   - the API, every 500 ms, from the host through the admin kubeconfig as the CLI reaches
//     it (client-go, kept connections);
//   - a Deployment of 3 replicas with a PodDisruptionBudget (minAvailable 2) behind a
//     ClusterIP Service, every 100 ms, from worker-0's network namespace (a fresh connection
//     each time, so every request is routed anew by kube-proxy).
//
// Every request must succeed; the counts are logged.
func TestAPIEndpoint(t *testing.T) {
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	images := filepath.Join(repoOutput(t), "images")
	d := &dayTwo{t: t, bin: bin, ws: ws, kubeconfig: filepath.Join(ws, "constellation-admin.conf")}
	out := miniUp(t, bin, ws, "--control-planes", "3", "--workers", "1")
	t.Logf("mini up:\n%s", phases(out))
	all := []string{"control-plane-0", "control-plane-1", "control-plane-2", "worker-0"}
	d.requireHealthy(all...)

	t.Run("everything names the load balancer", func(t *testing.T) {
		requireEndpointEverywhere(t, d)
	})

	kubectl(t, d.kubeconfig, "create", "configmap", "survivor", "--from-literal=written=before")
	serviceIP := deployWeb(t, d.kubeconfig, images)
	status, err := cluster.ReadStatus(filepath.Join(ws, "mini"))
	require.NoError(t, err)
	i := slices.IndexFunc(status.Nodes, func(n cluster.NodeStatus) bool { return n.Name == "worker-0" })
	require.GreaterOrEqual(t, i, 0)
	fromNode := status.Nodes[i].NetNS
	waitServiceServes(t, fromNode, serviceIP, 3)

	t.Run("reboot control-plane-0 without downtime", func(t *testing.T) {
		d := d.on(t)
		p := startPollers(t, d.kubeconfig, "web", "from worker-0", askWeb(fromNode, serviceIP))
		out := d.run("reboot", "control-plane-0")
		p.requireNoFailures(t)
		t.Logf("%s", out)
		assert.Regexp(t, `drain\s+control-plane-0: evicted .*default/web-`, out, "the web replica on control-plane-0 was evicted first")
		assert.Regexp(t, `uncordon\s+control-plane-0`, out)
		d.requireHealthy(all...)
	})

	t.Run("apply removes control-plane-0 without downtime", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(2, 1)
		p := startPollers(t, d.kubeconfig, "web", "from worker-0", askWeb(fromNode, serviceIP))
		out := d.run("apply", "--remove", "control-plane-0")
		p.requireNoFailures(t)
		t.Logf("%s", out)
		assert.Regexp(t, `shutdown\s+control-plane-0: shut down gracefully`, out)
		assert.Regexp(t, `removed\s+control-plane-0`, out)
		left := []string{"control-plane-1", "control-plane-2", "worker-0"}
		d.requireHealthy(left...)
		d.requireConsistent("control-plane-1", "control-plane-2")
		kubectl(t, d.kubeconfig, "rollout", "status", "deployment/web", "--timeout=120s")
	})
}

// requireEndpointEverywhere checks that kubeadm's controlPlaneEndpoint, kube-proxy's and the
// workers' kubeconfigs, and the join service's tickets name the load balancer, and that a
// client verifying the cluster CA reaches an API server through it (its address is in the
// certificate).
func requireEndpointEverywhere(t *testing.T, d *dayTwo) {
	lb := cluster.APIEndpoint()
	clusterConfig := kubectl(t, d.kubeconfig, "-n", "kube-system", "get", "configmap", "kubeadm-config", "-o", "jsonpath={.data.ClusterConfiguration}")
	assert.Contains(t, clusterConfig, "controlPlaneEndpoint: "+lb)
	proxyConfig := kubectl(t, d.kubeconfig, "-n", "kube-system", "get", "configmap", "kube-proxy", "-o", "jsonpath={.data.kubeconfig\\.conf}")
	assert.Contains(t, proxyConfig, "server: https://"+lb)
	ds := kubectl(t, d.kubeconfig, "-n", "kube-system", "get", "daemonset", "-o", "json")
	assert.Contains(t, ds, "--api-server-endpoint="+lb, "the join service's tickets name it")
	for _, pid := range nodeProcesses(t, d.ws, "worker-0", "kubelet") {
		conf, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/etc/kubernetes/kubelet.conf", pid))
		require.NoError(t, err)
		assert.Contains(t, string(conf), "server: https://"+lb, "worker-0's kubelet")
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", d.kubeconfig)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(cfg.CAData))
	bridge := sandbox.NSPath(sandbox.Network{ID: cluster.NetworkID(filepath.Join(d.ws, "mini"))}.BridgeNS())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := sandbox.DialContext(ctx, bridge, "tcp", lb)
	require.NoError(t, err)
	conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: strings.Split(lb, ":")[0], MinVersion: tls.VersionTLS12})
	defer conn.Close()
	require.NoError(t, conn.HandshakeContext(ctx), "the API server's certificate names the load balancer's address")
	t.Logf("through %s: an API server with SANs %v", lb, conn.ConnectionState().PeerCertificates[0].IPAddresses)
}

// deployWeb deploys the workload the pollers ask: 3 replicas of the hello server, one per
// node (one preferably on control-plane-0, so that its drain has to evict one), a budget of
// minAvailable 2, and a ClusterIP Service. A replica keeps serving 5 s after it is told to
// stop (preStop sleep), as a real server drains, so that kube-proxy stops sending it new
// connections before it is gone. It returns the Service's address.
func deployWeb(t *testing.T, kubeconfig, images string) string {
	t.Helper()
	applyManifest(t, kubeconfig, fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: web}}}]
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [control-plane-0]}]}
      terminationGracePeriodSeconds: 30
      containers:
      - name: hello
        image: %s
        imagePullPolicy: Never
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {port: 8080, path: /}, periodSeconds: 1}
        lifecycle: {preStop: {sleep: {seconds: 5}}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`, helloRef(t, images)))
	kubectl(t, kubeconfig, "rollout", "status", "deployment/web", "--timeout=180s")
	t.Logf("web replicas:\n%s", kubectl(t, kubeconfig, "get", "pods", "-l", "app=web", "-o", "wide"))
	ip := strings.TrimSpace(kubectl(t, kubeconfig, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	require.Regexp(t, `^10\.9[6-9]\.|^10\.1[01][0-9]\.`, ip)
	return ip
}

// waitServiceServes waits (polled, 2 minutes at most) until the web Service, asked from netns,
// has answered from each of replicas pods and then 20 times in a row: a new Service's
// endpoints reach each node's kube-proxy a moment after the pods are Ready, and until then
// the node refuses connections to it.
func waitServiceServes(t *testing.T, netns, ip string, replicas int) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return sandbox.DialContext(ctx, netns, network, addr)
		},
	}}
	seen := map[string]bool{}
	inARow := 0
	var last error
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		name, err := getWebName(ctx, c, ip)
		if last = err; err != nil {
			inARow = 0
			return false
		}
		seen[name] = true
		inARow++
		return len(seen) >= replicas && inARow >= 20
	}, 2*time.Minute, 50*time.Millisecond, "the web Service answers from worker-0 (seen %v; last error: %v)", seen, last)
}

// askWeb asks the web Service at ip from the network namespace netns, a fresh connection
// each time, so every request is routed anew by kube-proxy.
func askWeb(netns, ip string) func(context.Context) error {
	web := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return sandbox.DialContext(ctx, netns, network, addr)
		},
	}}
	return func(ctx context.Context) error {
		_, err := getWebName(ctx, web, ip)
		return err
	}
}

// getWebName asks the web Service once and returns the answering pod's name.
func getWebName(ctx context.Context, c *http.Client, ip string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ip+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil {
		return "", err
	}
	name, ok := strings.CutPrefix(strings.TrimSpace(string(body)), "hello from ")
	if resp.StatusCode != http.StatusOK || !ok || !strings.HasPrefix(name, "web-") {
		return "", fmt.Errorf("answer %s: %q", resp.Status, body)
	}
	return name, nil
}
