package etcdmember

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

// Runner runs etcdctl with args, adding connection flags of its own (certificates, endpoint),
// and returns what it printed. A nonzero exit is an *ExitError; stdout and stderr are returned
// with it.
type Runner interface {
	Run(ctx context.Context, args ...string) (stdout, stderr []byte, err error)
}

// ExitError is etcdctl's nonzero exit.
type ExitError struct {
	Code int
	// Stderr is the end of what etcdctl printed to stderr (its "Error: ..." line).
	Stderr string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("etcdctl exited with code %d: %s", e.Code, e.Stderr)
}

// NewExitError returns the ExitError of an etcdctl run that exited with code and printed stderr.
func NewExitError(code int, stderr []byte) *ExitError {
	return &ExitError{Code: code, Stderr: lastLine(stderr)}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return truncate(strings.TrimSpace(lines[len(lines)-1]))
}

// What kubeadm's etcd static pod offers etcdctl (kubeadm v1.34, phases/etcd/local.go): the pod
// mounts the node's /etc/kubernetes/pki/etcd at the same path, runs in the host network, and
// etcd listens for clients on https://127.0.0.1:2379 with client certificate authentication.
// The healthcheck client certificate is the one kubeadm's own etcd client uses for member
// operations; the pod's probes use plain HTTP on 127.0.0.1:2381, not etcdctl.
const (
	EtcdNamespace = "kube-system"
	EtcdContainer = "etcd"
	// Etcdctl is the client's name in the etcd image (on PATH, /usr/local/bin).
	Etcdctl = "etcdctl"
)

// PodFlags are etcdctl's connection flags inside kubeadm's etcd static pod.
var PodFlags = []string{
	"--cacert=/etc/kubernetes/pki/etcd/ca.crt",
	"--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
	"--key=/etc/kubernetes/pki/etcd/healthcheck-client.key",
	"--endpoints=https://127.0.0.1:2379",
}

// EtcdPodLabels select kubeadm's etcd static pods.
const EtcdPodLabels = "component=etcd,tier=control-plane"

// PodRunner runs etcdctl in the etcd static pod of a control plane, through the API server's
// pods/exec (as kubectl exec does). It keeps to one pod while etcdctl can be reached there.
// When it cannot (that etcd's container restarting, its node deleted: a deleted node's mirror
// pod lingers, still Running and Ready, until the pod garbage collector removes it), the
// run's error is transient (LostPodError) and the next run picks a pod again, so a caller's
// retry reaches another member instead of failing on one that is gone.
type PodRunner struct {
	config  *rest.Config
	client  kubernetes.Interface
	exclude string

	mu sync.Mutex
	// Node is the control plane whose etcd pod runs etcdctl; Pod is that pod. Both are empty
	// after a run lost the pod, until the next run picked another.
	Node, Pod string
}

// NewPodRunner returns a runner in the etcd pod of a control plane other than exclude (the node
// being removed): a Running and Ready mirror pod etcd-<node> in kube-system whose node exists
// and is Ready, the first by name. When there is none it returns a *NoPodError (transient: an
// etcd that restarts is back within seconds).
func NewPodRunner(ctx context.Context, config *rest.Config, client kubernetes.Interface, exclude string) (*PodRunner, error) {
	r := &PodRunner{config: config, client: client, exclude: exclude}
	if err := r.pick(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// NoPodError says that no etcd pod qualifies to run etcdctl in right now.
type NoPodError struct {
	Exclude string
	// Seen lists the etcd pods found and why each does not qualify.
	Seen []string
}

func (e *NoPodError) Error() string {
	seen := e.Seen
	if len(seen) == 0 {
		seen = []string{"none"}
	}
	return fmt.Sprintf("no running and ready etcd static pod on a control plane other than %s to run etcdctl in (etcd pods: %s)", e.Exclude, strings.Join(seen, ", "))
}

// Transient: etcd pods restart (a killed member, a rebooted control plane) within seconds.
func (e *NoPodError) Transient() bool { return true }

// LostPodError is a run that did not reach etcdctl in its pod; the next run picks a pod again.
type LostPodError struct{ Err error }

func (e *LostPodError) Error() string {
	return e.Err.Error() + " (etcdctl not reached there: the next attempt picks an etcd pod again)"
}
func (e *LostPodError) Unwrap() error { return e.Err }

// Transient: another member, or the same one restarted, answers the next attempt.
func (e *LostPodError) Transient() bool { return true }

// pick chooses the pod to run in.
func (r *PodRunner) pick(ctx context.Context) error {
	pods, err := r.client.CoreV1().Pods(EtcdNamespace).List(ctx, metav1.ListOptions{LabelSelector: EtcdPodLabels})
	if err != nil {
		return fmt.Errorf("finding etcd pods: %w", err)
	}
	nodes, err := r.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("finding the etcd pods' nodes: %w", err)
	}
	readyNodes := map[string]bool{}
	for _, n := range nodes.Items {
		readyNodes[n.Name] = n.DeletionTimestamp == nil && nodeReady(&n)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	var seen []string
	for i := range pods.Items {
		p := &pods.Items[i]
		seen = append(seen, p.Name+" on "+p.Spec.NodeName+" ("+string(p.Status.Phase)+")")
		if p.Spec.NodeName == "" || p.Spec.NodeName == r.exclude || p.Name != "etcd-"+p.Spec.NodeName {
			continue
		}
		// A mirror pod: the kubelet of that node runs it from kubeadm's manifest.
		if _, ok := p.Annotations[corev1.MirrorPodAnnotationKey]; !ok {
			continue
		}
		if p.Status.Phase != corev1.PodRunning || !ready(p) {
			continue
		}
		// The status of a deleted node's mirror pod is its kubelet's last word.
		if ready, ok := readyNodes[p.Spec.NodeName]; !ok {
			seen[len(seen)-1] = p.Name + " on " + p.Spec.NodeName + " (node gone)"
			continue
		} else if !ready {
			seen[len(seen)-1] = p.Name + " on " + p.Spec.NodeName + " (node not Ready)"
			continue
		}
		r.mu.Lock()
		r.Node, r.Pod = p.Spec.NodeName, p.Name
		r.mu.Unlock()
		return nil
	}
	return &NoPodError{Exclude: r.exclude, Seen: seen}
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Command is what the runner executes in the pod for args.
func (r *PodRunner) Command(args ...string) []string {
	cmd := append([]string{Etcdctl}, PodFlags...)
	return append(cmd, args...)
}

// Run runs etcdctl in the pod, picking one first when the last run lost its pod. A failure
// to reach etcdctl (not etcdctl's own exit, nor a refusal of the exec itself) is a
// *LostPodError.
func (r *PodRunner) Run(ctx context.Context, args ...string) ([]byte, []byte, error) {
	r.mu.Lock()
	pod := r.Pod
	r.mu.Unlock()
	if pod == "" {
		if err := r.pick(ctx); err != nil {
			return nil, nil, err
		}
		r.mu.Lock()
		pod = r.Pod
		r.mu.Unlock()
	}
	stdout, stderr, err := r.exec(ctx, pod, args)
	var exit *ExitError
	// Exit code 137 is etcdctl killed by SIGKILL: its container was killed under it (the
	// member of that pod died and the kubelet restarts it), not an answer of etcd.
	killed := errors.As(err, &exit) && exit.Code == 137
	if err != nil && (killed || !errors.As(err, &exit)) && !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) && ctx.Err() == nil {
		r.mu.Lock()
		if r.Pod == pod {
			r.Node, r.Pod = "", ""
		}
		r.mu.Unlock()
		err = &LostPodError{Err: err}
	}
	return stdout, stderr, err
}

func (r *PodRunner) exec(ctx context.Context, pod string, args []string) ([]byte, []byte, error) {
	req := r.client.CoreV1().RESTClient().Post().
		Namespace(EtcdNamespace).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: EtcdContainer,
			Command:   r.Command(args...),
			Stdout:    true,
			Stderr:    true,
		}, scheme.ParameterCodec)
	// As kubectl exec: WebSockets, falling back to SPDY for servers that do not upgrade them.
	spdy, err := remotecommand.NewSPDYExecutor(r.config, "POST", req.URL())
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s/%s: %w", EtcdNamespace, pod, err)
	}
	ws, err := remotecommand.NewWebSocketExecutor(r.config, "GET", req.URL().String())
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s/%s: %w", EtcdNamespace, pod, err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s/%s: %w", EtcdNamespace, pod, err)
	}
	stdout, stderr := &limitedBuffer{limit: MaxOutputBytes}, &limitedBuffer{limit: MaxOutputBytes}
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
	var exitErr utilexec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr) && exitErr.Exited():
		err = NewExitError(exitErr.ExitStatus(), stderr.Bytes())
	default:
		err = fmt.Errorf("exec in %s/%s: %w", EtcdNamespace, pod, err)
	}
	return stdout.Bytes(), stderr.Bytes(), err
}

// limitedBuffer keeps at most limit bytes and fails writes beyond, which ends the stream.
type limitedBuffer struct {
	bytes.Buffer
	limit int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.limit {
		return 0, fmt.Errorf("etcdctl printed more than %d bytes", b.limit)
	}
	return b.Buffer.Write(p)
}
