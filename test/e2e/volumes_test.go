package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
)

// volumeApp is the README's application ("Run your application"): a Deployment of one
// replica whose PersistentVolumeClaim has the cluster's default StorageClass, behind a
// LoadBalancer Service, keeping what is PUT to /data on its volume.
type volumeApp struct {
	t          testing.TB
	kubeconfig string
	name       string
	addr       string
	client     *http.Client
}

// deployVolumeApp deploys the application named name (its claim is <name>-data, of class
// class; "" for the default class), preferring node prefer ("" for any), and waits until it
// serves through its load balancer.
func deployVolumeApp(t testing.TB, kubeconfig, images, name, class, prefer string) *volumeApp {
	t.Helper()
	classLine, affinity := "", ""
	if class != "" {
		classLine = "storageClassName: " + class + ", "
	}
	if prefer != "" {
		affinity = `affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [` + prefer + `]}]}}]}}`
	}
	applyManifest(t, kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %[1]s-data, namespace: default}
spec: {%[3]saccessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: default}
spec:
  selector: {matchLabels: {app: %[1]s}}
  strategy: {type: Recreate}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      terminationGracePeriodSeconds: 5
      %[4]s
      containers:
      - name: app
        image: %[2]s
        imagePullPolicy: Never
        ports: [{containerPort: 8080}]
        env: [{name: DATA_DIR, value: /data}]
        readinessProbe: {httpGet: {port: 8080, path: /}, periodSeconds: 1}
        volumeMounts: [{name: data, mountPath: /data}]
      volumes: [{name: data, persistentVolumeClaim: {claimName: %[1]s-data}}]
---
apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: %[1]s}
  ports: [{port: 80, targetPort: 8080}]
`, name, helloRef(t, images), classLine, affinity))
	a := &volumeApp{t: t, kubeconfig: kubeconfig, name: name, client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	a.waitReady(4 * time.Minute)
	bin := kubectlPath(t)
	var ip string
	require.Eventually(t, func() bool {
		ip = kubectlQuiet(bin, kubeconfig, "get", "service", name, "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}")
		return ip != ""
	}, time.Minute, time.Second, "Service %s gets its LoadBalancer address", name)
	a.addr = net.JoinHostPort(ip, "80")
	return a
}

// waitReady waits until the application's one pod is Ready, naming where it waits.
func (a *volumeApp) waitReady(timeout time.Duration) {
	a.t.Helper()
	kubectl(a.t, a.kubeconfig, "rollout", "status", "deployment/"+a.name, "--timeout="+timeout.String())
	kubectl(a.t, a.kubeconfig, "wait", "--for=condition=Ready", "pod", "-l", "app="+a.name, "--timeout="+timeout.String())
}

// node is the node the application's pod runs on.
func (a *volumeApp) node() string {
	a.t.Helper()
	return kubectl(a.t, a.kubeconfig, "get", "pod", "-l", "app="+a.name, "--field-selector=status.phase=Running", "-o", "jsonpath={.items[0].spec.nodeName}")
}

func (a *volumeApp) do(ctx context.Context, method, body string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+a.addr+"/data", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s /data: %s: %s", method, resp.Status, strings.TrimSpace(string(got)))
	}
	return string(got), nil
}

// put stores data, retrying for a minute while the load balancer finds the pod.
func (a *volumeApp) put(data string) {
	a.t.Helper()
	require.EventuallyWithT(a.t, func(c *assert.CollectT) {
		_, err := a.do(context.Background(), http.MethodPut, data)
		assert.NoError(c, err)
	}, time.Minute, 500*time.Millisecond, "PUT /data through %s", a.addr)
}

// requireData waits (a minute at most) until the application serves through its load balancer
// again, then reads /data 20 times in 10 s: every read must answer want, not one may fail.
func (a *volumeApp) requireData(want string) {
	a.t.Helper()
	a.waitReady(4 * time.Minute)
	require.EventuallyWithT(a.t, func(c *assert.CollectT) {
		_, err := a.do(context.Background(), http.MethodGet, "")
		assert.NoError(c, err)
	}, time.Minute, 500*time.Millisecond, "GET /data through %s", a.addr)
	failed := 0
	for i := range 20 {
		got, err := a.do(context.Background(), http.MethodGet, "")
		if err != nil || got != want {
			failed++
			a.t.Errorf("read %d of /data: %q, %v; want %q", i+1, got, err, want)
		}
		time.Sleep(500 * time.Millisecond)
	}
	require.Zero(a.t, failed, "failed reads of the volume's data once the pod is Ready")
}

// requireMovableVolume checks claim's volume as the platform keeps it: a volume of the
// encrypted driver, its file in the provider's store (outside every node's state storage)
// attached to node, holding no plaintext of secret.
func requireMovableVolume(t testing.TB, kubeconfig, ws, claim, node, secret string) {
	t.Helper()
	pv := kubectl(t, kubeconfig, "get", "pvc", claim, "-o", "jsonpath={.spec.volumeName}")
	require.Equal(t, csidriver.Name, kubectl(t, kubeconfig, "get", "pv", pv, "-o", "jsonpath={.spec.csi.driver}"),
		"claim %s has a volume of the encrypted driver (the default StorageClass)", claim)
	id := kubectl(t, kubeconfig, "get", "pv", pv, "-o", "jsonpath={.spec.csi.volumeHandle}")
	require.True(t, csidriver.ValidID(id), "volume handle %q", id)
	store := filepath.Join(ws, "mini", "volumes")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		record, err := os.ReadFile(filepath.Join(store, id+".json"))
		if !assert.NoError(c, err) {
			return
		}
		var v struct {
			AttachedTo string `json:"attachedTo"`
		}
		assert.NoError(c, json.Unmarshal(record, &v))
		assert.Equal(c, node, v.AttachedTo, "the provider attached volume %s to %s", id, node)
	}, time.Minute, time.Second)
	image, err := os.ReadFile(filepath.Join(store, id+".img"))
	require.NoError(t, err)
	assert.False(t, bytes.Contains(image, []byte(secret)), "the host sees no plaintext in the volume's file")
}
