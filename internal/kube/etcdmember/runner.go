package etcdmember

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
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
// pods/exec (as kubectl exec does).
type PodRunner struct {
	config *rest.Config
	client kubernetes.Interface
	// Node is the control plane whose etcd pod runs etcdctl; Pod is that pod.
	Node, Pod string
}

// NewPodRunner returns a runner in the etcd pod of a control plane other than exclude (the node
// being removed): a Running and Ready mirror pod etcd-<node> in kube-system, the first by name.
func NewPodRunner(ctx context.Context, config *rest.Config, client kubernetes.Interface, exclude string) (*PodRunner, error) {
	pods, err := client.CoreV1().Pods(EtcdNamespace).List(ctx, metav1.ListOptions{LabelSelector: EtcdPodLabels})
	if err != nil {
		return nil, fmt.Errorf("finding etcd pods: %w", err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	var seen []string
	for i := range pods.Items {
		p := &pods.Items[i]
		seen = append(seen, p.Name+" on "+p.Spec.NodeName+" ("+string(p.Status.Phase)+")")
		if p.Spec.NodeName == "" || p.Spec.NodeName == exclude || p.Name != "etcd-"+p.Spec.NodeName {
			continue
		}
		// A mirror pod: the kubelet of that node runs it from kubeadm's manifest.
		if _, ok := p.Annotations[corev1.MirrorPodAnnotationKey]; !ok {
			continue
		}
		if p.Status.Phase != corev1.PodRunning || !ready(p) {
			continue
		}
		return &PodRunner{config: config, client: client, Node: p.Spec.NodeName, Pod: p.Name}, nil
	}
	if len(seen) == 0 {
		seen = []string{"none"}
	}
	return nil, fmt.Errorf("no running and ready etcd static pod on a control plane other than %s to run etcdctl in (etcd pods: %s)", exclude, strings.Join(seen, ", "))
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
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

// Run runs etcdctl in the pod.
func (r *PodRunner) Run(ctx context.Context, args ...string) ([]byte, []byte, error) {
	req := r.client.CoreV1().RESTClient().Post().
		Namespace(EtcdNamespace).Resource("pods").Name(r.Pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: EtcdContainer,
			Command:   r.Command(args...),
			Stdout:    true,
			Stderr:    true,
		}, scheme.ParameterCodec)
	// As kubectl exec: WebSockets, falling back to SPDY for servers that do not upgrade them.
	spdy, err := remotecommand.NewSPDYExecutor(r.config, "POST", req.URL())
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s/%s: %w", EtcdNamespace, r.Pod, err)
	}
	ws, err := remotecommand.NewWebSocketExecutor(r.config, "GET", req.URL().String())
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s/%s: %w", EtcdNamespace, r.Pod, err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s/%s: %w", EtcdNamespace, r.Pod, err)
	}
	stdout, stderr := &limitedBuffer{limit: MaxOutputBytes}, &limitedBuffer{limit: MaxOutputBytes}
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
	var exitErr utilexec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr) && exitErr.Exited():
		err = NewExitError(exitErr.ExitStatus(), stderr.Bytes())
	default:
		err = fmt.Errorf("exec in %s/%s: %w", EtcdNamespace, r.Pod, err)
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
