package etcdmember_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/tools/remotecommand"
	kubeletremotecommand "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/openconstellation/constellation/internal/kube/etcdmember"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
)

// TestPodRunnerThroughAPIServer runs etcdctl as the CLI does: pods/exec on a real kube-apiserver,
// which streams to the node's kubelet. The kubelet here is the kubelet's own exec server
// (k8s.io/kubelet's streaming remotecommand, as the CRI streaming server runs it) in front of a
// "container" that is this machine seen through the etcd pod's mounts and network: kubeadm's
// certificate paths map to the test cluster's files, 127.0.0.1:2379 to the member of the pod's
// node. etcdctl and etcd are real.
func TestPodRunnerThroughAPIServer(t *testing.T) {
	etcd := startEtcdCluster(t, 3)
	kube := kubetest.Start(t, kubetest.Options{})
	kubelet := startExecKubelet(t, etcd)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Control planes m0..m2, each with its etcd mirror pod; m1's is not ready.
	for i, m := range etcd.members {
		kubelet.addNode(t, kube, m.name, i, i != 1)
	}

	// Removing m0: the runner must use another control plane's etcd, and not the unready one.
	runner, err := etcdmember.NewPodRunner(ctx, kube.AdminConfig, kube.Admin, "m0")
	require.NoError(t, err)
	assert.Equal(t, "m2", runner.Node)
	assert.Equal(t, "etcd-m2", runner.Pod)

	// m1 crashes: endpoint health exits 1 after printing every result; both travel through
	// the API server.
	etcd.kill(1)
	client := etcdmember.New(runner, time.Second)
	members, err := client.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"m0 (healthy)", "m1 (unhealthy: context deadline exceeded)", "m2 (healthy)"}, names(members))
	_, err = client.Remove(ctx, "m0")
	var refused *etcdmember.RefusedError
	require.ErrorAs(t, err, &refused)

	removal, err := client.Remove(ctx, "m1")
	require.NoError(t, err)
	assert.Equal(t, "m1", removal.Member.Name)
	members, err = client.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"m0 (healthy)", "m2 (healthy)"}, names(members))

	// What ran in the pod: kubeadm's flags, then the command.
	cmds := kubelet.commands()
	require.NotEmpty(t, cmds)
	for _, c := range cmds {
		assert.Equal(t, "kube-system/etcd-m2/etcd", c.target)
		assert.Equal(t, append([]string{"etcdctl"}, etcdmember.PodFlags...), c.argv[:1+len(etcdmember.PodFlags)])
	}

	// A failing command keeps its exit code and error line across the API server.
	_, _, err = runner.Run(ctx, "member", "remove", "ffff")
	var exit *etcdmember.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 1, exit.Code)
	assert.Contains(t, exit.Stderr, "member not found")

	// Removing m2 instead: m0's etcd runs etcdctl.
	other, err := etcdmember.NewPodRunner(ctx, kube.AdminConfig, kube.Admin, "m2")
	require.NoError(t, err)
	assert.Equal(t, "etcd-m0", other.Pod)

	// The runner's pod is lost: m0's Node is deleted while its mirror pod lingers, Running
	// and Ready (the pod garbage collector removes it later). The run that finds out is
	// transient, the next one runs in another pod, and a new runner never picks that pod.
	lost, err := etcdmember.NewPodRunner(ctx, kube.AdminConfig, kube.Admin, "m1")
	require.NoError(t, err)
	assert.Equal(t, "etcd-m0", lost.Pod)
	require.NoError(t, kube.Admin.CoreV1().Nodes().Delete(ctx, "m0", metav1.DeleteOptions{}))
	_, _, err = lost.Run(ctx, "member", "list")
	var lostErr *etcdmember.LostPodError
	require.ErrorAs(t, err, &lostErr)
	assert.True(t, etcdmember.Transient(err), "%v", err)
	assert.Contains(t, err.Error(), "exec in kube-system/etcd-m0")
	_, _, err = lost.Run(ctx, "member", "list")
	require.NoError(t, err)
	assert.Equal(t, "etcd-m2", lost.Pod)
	fresh, err := etcdmember.NewPodRunner(ctx, kube.AdminConfig, kube.Admin, "m1")
	require.NoError(t, err)
	assert.Equal(t, "etcd-m2", fresh.Pod, "a pod whose node is gone is never picked")
	_, err = etcdmember.NewPodRunner(ctx, kube.AdminConfig, kube.Admin, "m2")
	var noPod *etcdmember.NoPodError
	require.ErrorAs(t, err, &noPod)
	assert.True(t, etcdmember.Transient(err))
	assert.Contains(t, err.Error(), "etcd-m0 on m0 (node gone)")

	// No other control plane with a running etcd: a clear error.
	zero := int64(0)
	require.NoError(t, kube.Admin.CoreV1().Pods("kube-system").Delete(ctx, "etcd-m0", metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	_, err = etcdmember.NewPodRunner(ctx, kube.AdminConfig, kube.Admin, "m2")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no running and ready etcd static pod on a control plane other than m2")
	assert.Contains(t, err.Error(), "etcd-m1 on m1 (Pending)")
}

// execKubelet serves the kubelet's exec endpoint for the pods of every test node.
type execKubelet struct {
	etcd *etcdCluster
	port int

	mu   sync.Mutex
	ran  []ranCommand
	node map[string]int // node name → member index
}

type ranCommand struct {
	target string
	argv   []string
}

func startExecKubelet(t *testing.T, etcd *etcdCluster) *execKubelet {
	k := &execKubelet{etcd: etcd, node: map[string]int{}}
	mux := http.NewServeMux()
	// The kubelet's route for exec: /exec/{namespace}/{pod}/{container}.
	mux.HandleFunc("/exec/{namespace}/{pod}/{container}", k.serveExec)
	// The API server skips verifying the kubelet's certificate when it has no kubelet CA
	// (--kubelet-certificate-authority), as in kubeadm's default setup.
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = false
	srv.StartTLS()
	t.Cleanup(srv.Close)
	k.port = srv.Listener.Addr().(*net.TCPAddr).Port
	return k
}

// addNode creates a control-plane node whose kubelet is k, and its etcd mirror pod for member i.
func (k *execKubelet) addNode(t *testing.T, kube *kubetest.Cluster, name string, i int, ready bool) {
	t.Helper()
	ctx := context.Background()
	node, err := kube.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{"node-role.kubernetes.io/control-plane": ""},
	}}, metav1.CreateOptions{})
	require.NoError(t, err)
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(k.port)
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	_, err = kube.Admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	require.NoError(t, err)
	k.mu.Lock()
	k.node[name] = i
	k.mu.Unlock()

	pod, err := kube.Admin.CoreV1().Pods("kube-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "etcd-" + name, Namespace: "kube-system",
			Labels:      map[string]string{"component": "etcd", "tier": "control-plane"},
			Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "c0ffee"},
		},
		Spec: corev1.PodSpec{
			NodeName:    name,
			HostNetwork: true,
			Containers:  []corev1.Container{{Name: "etcd", Image: "registry.k8s.io/etcd:3.6.5-0", Command: []string{"etcd"}}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	if ready {
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		_, err = kube.Admin.CoreV1().Pods("kube-system").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
}

func (k *execKubelet) commands() []ranCommand {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]ranCommand(nil), k.ran...)
}

func (k *execKubelet) serveExec(w http.ResponseWriter, req *http.Request) {
	ns, pod, container := req.PathValue("namespace"), req.PathValue("pod"), req.PathValue("container")
	opts, err := kubeletremotecommand.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	argv := req.URL.Query()["command"]
	k.mu.Lock()
	k.ran = append(k.ran, ranCommand{target: ns + "/" + pod + "/" + container, argv: argv})
	member, ok := k.node[strings.TrimPrefix(pod, "etcd-")]
	k.mu.Unlock()
	if !ok || ns != "kube-system" || container != "etcd" {
		http.Error(w, "no such container", http.StatusNotFound)
		return
	}
	kubeletremotecommand.ServeExec(w, req, &hostContainer{etcd: k.etcd, member: member}, pod, types.UID(""), container, argv,
		opts, time.Minute, 30*time.Second, remotecommandconsts.SupportedStreamingProtocols)
}

// hostContainer runs a command of the etcd container on this machine: the pod's view of its
// mounts (kubeadm's /etc/kubernetes/pki/etcd) and of its node's loopback (etcd on :2379) map to
// the test cluster.
type hostContainer struct {
	etcd   *etcdCluster
	member int
}

func (h *hostContainer) ExecInContainer(ctx context.Context, _ string, _ types.UID, _ string, cmd []string, _ io.Reader, stdout, stderr io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(cmd) == 0 || cmd[0] != etcdmember.Etcdctl {
		return utilexec.CodeExitError{Err: errors.New("executable file not found in $PATH"), Code: 127}
	}
	args := make([]string, len(cmd)-1)
	for i, a := range cmd[1:] {
		a = strings.ReplaceAll(a, "/etc/kubernetes/pki/etcd", h.etcd.pkiDir)
		a = strings.ReplaceAll(a, "https://127.0.0.1:2379", h.etcd.members[h.member].clientURL)
		args[i] = a
	}
	out, errOut, err := runEtcdctl(ctx, h.etcd.etcdctl, args)
	_, _ = stdout.Write(out)
	_, _ = stderr.Write(errOut)
	var exit *etcdmember.ExitError
	if errors.As(err, &exit) {
		return utilexec.CodeExitError{Err: errors.New("exit status " + strconv.Itoa(exit.Code)), Code: exit.Code}
	}
	return err
}
