// Package drain empties a Kubernetes node before it is removed: it cordons the node, evicts its
// pods through the Eviction API (so PodDisruptionBudgets are respected), waits until they are
// gone, and deletes the Node object.
//
// It does what `kubectl drain --ignore-daemonsets --delete-emptydir-data --force` does, written
// against policy/v1 directly instead of k8s.io/kubectl/pkg/drain: that package retries a blocked
// eviction with a fixed 5 s sleep that ignores its context, reports a timeout without the budget
// that blocked it, and brings kubectl's command utilities into the module. Removing a node needs
// exactly that report: which pod is still there and which budget keeps it.
package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Defaults of Options.
const (
	DefaultTimeout       = 5 * time.Minute
	DefaultRetryInterval = 2 * time.Second
)

// MirrorPodAnnotation marks the API server's copy of a kubelet's static pod (corev1.MirrorPodAnnotationKey).
const MirrorPodAnnotation = corev1.MirrorPodAnnotationKey

// Options tune a drain.
type Options struct {
	// Timeout bounds the whole drain: cordon, evictions and waiting for the evicted pods to
	// terminate. DefaultTimeout when zero.
	Timeout time.Duration
	// RetryInterval is the pause between rounds: retrying evictions a PodDisruptionBudget
	// refused and checking whether evicted pods are gone. DefaultRetryInterval when zero.
	RetryInterval time.Duration
	// GracePeriod, when set, overrides the pods' terminationGracePeriodSeconds. Nil keeps each
	// pod's own, as kubectl drain does.
	GracePeriod *time.Duration
	// Log receives progress (evictions, refusals). Discarded when nil.
	Log *slog.Logger
	// KeepUnmanaged leaves pods without a controller on the node (SkipUnmanaged): for a
	// drain before a reboot, after which the node's kubelet runs them again, whereas an
	// eviction would end them for good.
	KeepUnmanaged bool
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = DefaultRetryInterval
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// PodRef names a pod.
type PodRef struct {
	Namespace, Name string
}

func (p PodRef) String() string { return p.Namespace + "/" + p.Name }

func refOf(p *corev1.Pod) PodRef { return PodRef{Namespace: p.Namespace, Name: p.Name} }

// Reasons a pod stays on a drained node.
const (
	SkipDaemonSet = "DaemonSet pod (its controller ignores cordons; it ends with the node)"
	SkipMirror    = "static pod (the kubelet runs it from a file on the node; it ends with the node)"
	SkipUnmanaged = "pod without a controller (nothing would recreate it elsewhere; it stays for the node's kubelet to run again)"
)

// SkippedPod is a pod a drain leaves on the node, and why.
type SkippedPod struct {
	Pod    PodRef
	Reason string
}

// Plan is what a drain of a node would do, computed without changing anything.
type Plan struct {
	Node string
	// Cordoned: the node is already unschedulable.
	Cordoned bool
	// Evict are the pods a drain evicts; Unmanaged is the subset without a controller that
	// would recreate them elsewhere (they are gone for good).
	Evict, Unmanaged []PodRef
	// Skip are the pods a drain leaves on the node.
	Skip []SkippedPod
}

// Report is what a drain did.
type Report struct {
	Node string
	// Cordoned: this drain marked the node unschedulable (false: it already was).
	Cordoned bool
	// Evicted are the pods that were on the node and are gone now: evicted by this drain, or
	// deleted by someone else while it ran.
	Evicted []PodRef
	// Skipped are the pods left on the node.
	Skipped []SkippedPod
	// Took is how long the drain took.
	Took time.Duration
}

// ErrNodeNotFound is wrapped by errors about a node that does not exist in Kubernetes.
var ErrNodeNotFound = errors.New("node not found")

// StuckPod is a pod that was still on the node when a drain timed out.
type StuckPod struct {
	Pod PodRef
	// Budgets names the PodDisruptionBudgets (namespace/name) that refused the pod's last
	// eviction; empty when none did.
	Budgets []string
	// Reason says why the pod is still there: the API server's refusal, or that the pod was
	// evicted and is still terminating.
	Reason string
}

func (s StuckPod) String() string {
	if len(s.Budgets) > 0 {
		return fmt.Sprintf("%s blocked by PodDisruptionBudget %s (%s)", s.Pod, strings.Join(s.Budgets, ", "), s.Reason)
	}
	return fmt.Sprintf("%s: %s", s.Pod, s.Reason)
}

// TimeoutError is returned when pods are still on the node when the drain's time is up. It
// names every such pod and what holds it. errors.Is(err, context.DeadlineExceeded) holds.
type TimeoutError struct {
	Node string
	// Timeout is the drain's time limit: Options.Timeout, or what was left until the caller's
	// deadline when that came first.
	Timeout time.Duration
	Pods    []StuckPod
	// Report is what the drain did before it gave up.
	Report Report
	// LastError is the last transient failure of the API server the drain retried, if any.
	LastError error
}

func (e *TimeoutError) Error() string {
	pods := make([]string, len(e.Pods))
	for i, p := range e.Pods {
		pods[i] = p.String()
	}
	msg := fmt.Sprintf("draining node %q: %d pod(s) still on the node after %s: %s",
		e.Node, len(e.Pods), e.Timeout, strings.Join(pods, "; "))
	if e.LastError != nil {
		msg += fmt.Sprintf(" (last API error: %v)", e.LastError)
	}
	return msg
}

func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// PlanDrain returns what Drain would do to node now, without changing anything: for `apply`
// to say what it changes before it does it.
func PlanDrain(ctx context.Context, client kubernetes.Interface, node string) (Plan, error) {
	n, err := getNode(ctx, client, node)
	if err != nil {
		return Plan{}, err
	}
	pods, err := podsOn(ctx, client, node)
	if err != nil {
		return Plan{}, err
	}
	plan := Plan{Node: node, Cordoned: n.Spec.Unschedulable}
	for i := range pods {
		p := &pods[i]
		if reason, skip := skipReason(p, false); skip {
			plan.Skip = append(plan.Skip, SkippedPod{Pod: refOf(p), Reason: reason})
			continue
		}
		plan.Evict = append(plan.Evict, refOf(p))
		if metav1.GetControllerOf(p) == nil {
			plan.Unmanaged = append(plan.Unmanaged, refOf(p))
		}
	}
	return plan, nil
}

// Drain cordons node and evicts every pod on it except DaemonSet and static (mirror) pods,
// through the Eviction API, so that PodDisruptionBudgets are respected: an eviction a budget
// refuses is retried every RetryInterval. It returns when every evicted pod is gone (its
// kubelet stopped it within its grace period and deleted it), or a *TimeoutError naming each
// pod still there and the budget holding it after Timeout. Cordoning is idempotent; a missing
// node is an error wrapping ErrNodeNotFound.
//
// Pods without a controller and pods with emptyDir volumes are evicted too (kubectl drain
// wants --force and --delete-emptydir-data for them): the node is going away, so they end
// either way. PlanDrain lists them beforehand.
func Drain(ctx context.Context, client kubernetes.Interface, node string, opts Options) (Report, error) {
	opts = opts.withDefaults()
	start := time.Now()
	// The timeout a TimeoutError reports: the caller's deadline when that comes first.
	timeout := opts.Timeout
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < timeout {
		timeout = time.Until(deadline).Round(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()

	report := Report{Node: node}
	// The API server may restart or lose its etcd leader while a node is drained: such
	// failures are retried within the drain's time (every step is idempotent).
	var cordoned bool
	err := retry.Do(ctx, retry.Policy{Initial: opts.RetryInterval / 4, Max: opts.RetryInterval, Factor: 2, Jitter: 0.2}, nil, func(ctx context.Context) error {
		var err error
		cordoned, err = cordon(ctx, client, node)
		return err
	})
	if err != nil {
		return report, err
	}
	report.Cordoned = cordoned
	if cordoned {
		opts.Log.Info("cordoned node", "node", node)
	}

	d := drainer{client: client, node: node, opts: opts, timeout: timeout, seen: map[types.UID]*podState{}, skipped: map[types.UID]bool{}}
	for {
		remaining, err := d.round(ctx, &report)
		switch {
		case err != nil && ctx.Err() != nil:
			report.Took = time.Since(start)
			return report, d.stopped(ctx, report)
		case err != nil && retry.Transient(err):
			// Listing the node's pods failed for a passing reason: the next round lists again.
			d.lastErr = err
			opts.Log.Warn("drain round failed, will retry", "node", node, "error", err)
			remaining = -1
		case err != nil:
			report.Took = time.Since(start)
			return report, err
		}
		if remaining == 0 {
			report.Took = time.Since(start)
			sortRefs(report.Evicted)
			return report, nil
		}
		select {
		case <-ctx.Done():
			report.Took = time.Since(start)
			return report, d.stopped(ctx, report)
		case <-time.After(opts.RetryInterval):
		}
	}
}

// Uncordon makes node schedulable again (a merge patch of spec.unschedulable only) and
// reports whether it changed anything: after a drained node's reboot.
func Uncordon(ctx context.Context, client kubernetes.Interface, node string) (bool, error) {
	n, err := getNode(ctx, client, node)
	if err != nil {
		return false, err
	}
	if !n.Spec.Unschedulable {
		return false, nil
	}
	_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType,
		[]byte(`{"spec":{"unschedulable":false}}`), metav1.PatchOptions{})
	if err != nil {
		return false, fmt.Errorf("uncordoning node %q: %w", node, err)
	}
	return true, nil
}

// Delete deletes the Node object. A node that does not exist is not an error, so that `apply`
// re-run after an interruption finishes the removal.
func Delete(ctx context.Context, client kubernetes.Interface, node string) error {
	err := client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting node %q: %w", node, err)
	}
	return nil
}

func getNode(ctx context.Context, client kubernetes.Interface, node string) (*corev1.Node, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("node %q: %w in Kubernetes: %w", node, ErrNodeNotFound, err)
	}
	if err != nil {
		return nil, fmt.Errorf("getting node %q: %w", node, err)
	}
	return n, nil
}

// cordon marks node unschedulable and reports whether it changed anything.
func cordon(ctx context.Context, client kubernetes.Interface, node string) (bool, error) {
	n, err := getNode(ctx, client, node)
	if err != nil {
		return false, err
	}
	if n.Spec.Unschedulable {
		return false, nil
	}
	// A merge patch of the one field: concurrent writers of other fields (the kubelet's
	// status, labels) do not conflict with it.
	_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType,
		[]byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return false, fmt.Errorf("node %q: %w in Kubernetes: %w", node, ErrNodeNotFound, err)
	}
	if err != nil {
		return false, fmt.Errorf("cordoning node %q: %w", node, err)
	}
	return true, nil
}

func podsOn(ctx context.Context, client kubernetes.Interface, node string) ([]corev1.Pod, error) {
	list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing pods on node %q: %w", node, err)
	}
	sort.Slice(list.Items, func(i, j int) bool {
		return refOf(&list.Items[i]).String() < refOf(&list.Items[j]).String()
	})
	return list.Items, nil
}

func skipReason(p *corev1.Pod, keepUnmanaged bool) (string, bool) {
	if _, ok := p.Annotations[MirrorPodAnnotation]; ok {
		return SkipMirror, true
	}
	c := metav1.GetControllerOf(p)
	if c != nil && c.Kind == "DaemonSet" && strings.HasPrefix(c.APIVersion, "apps/") {
		return SkipDaemonSet, true
	}
	if c == nil && keepUnmanaged {
		return SkipUnmanaged, true
	}
	return "", false
}

// podState is what the drain knows about a pod it is evicting.
type podState struct {
	ref PodRef
	// evicted: the API server accepted the eviction (or the pod was already being deleted).
	evicted bool
	// budgets and reason of the last refusal.
	budgets []string
	reason  string
}

type drainer struct {
	client  kubernetes.Interface
	node    string
	opts    Options
	timeout time.Duration
	seen    map[types.UID]*podState
	skipped map[types.UID]bool
	// lastErr is the last transient failure of a round, named if the drain times out.
	lastErr error
}

// round lists the pods on the node, evicts those not yet evicted, records pods that are gone,
// and returns how many pods the drain still waits for.
func (d *drainer) round(ctx context.Context, report *Report) (int, error) {
	pods, err := podsOn(ctx, d.client, d.node)
	if err != nil {
		return 0, err
	}
	present := map[types.UID]bool{}
	remaining := 0
	for i := range pods {
		p := &pods[i]
		if reason, skip := skipReason(p, d.opts.KeepUnmanaged); skip {
			if !d.skipped[p.UID] {
				d.skipped[p.UID] = true
				report.Skipped = append(report.Skipped, SkippedPod{Pod: refOf(p), Reason: reason})
			}
			continue
		}
		present[p.UID] = true
		remaining++
		st := d.seen[p.UID]
		if st == nil {
			st = &podState{ref: refOf(p), reason: "not evicted yet"}
			d.seen[p.UID] = st
		}
		if p.DeletionTimestamp != nil {
			st.evicted = true
			st.budgets, st.reason = nil, terminatingReason(p)
			continue
		}
		if err := d.evict(ctx, p, st); err != nil {
			return remaining, err
		}
	}
	for uid, st := range d.seen {
		if !present[uid] {
			report.Evicted = append(report.Evicted, st.ref)
			delete(d.seen, uid)
		}
	}
	return remaining, nil
}

// evict asks the API server to evict p and records the outcome in st. It returns an error only
// for refusals that waiting does not change (permissions, invalid requests).
func (d *drainer) evict(ctx context.Context, p *corev1.Pod, st *podState) error {
	opts := &metav1.DeleteOptions{
		// The eviction is for this pod, not for a successor of the same name.
		Preconditions: &metav1.Preconditions{UID: &p.UID},
	}
	if d.opts.GracePeriod != nil {
		secs := int64(d.opts.GracePeriod.Seconds())
		opts.GracePeriodSeconds = &secs
	}
	err := d.client.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
		DeleteOptions: opts,
	})
	switch {
	case err == nil:
		if !st.evicted {
			d.opts.Log.Info("evicted pod", "node", d.node, "pod", st.ref.String())
		}
		st.evicted = true
		st.budgets, st.reason = nil, "evicted, still terminating"
		return nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Gone, or replaced by a pod of the same name: the next round's list tells.
		st.evicted = true
		st.budgets, st.reason = nil, "evicted, still terminating"
		return nil
	case apierrors.IsTooManyRequests(err):
		st.budgets, st.reason = d.budgetsOf(ctx, p), refusal(err)
		d.opts.Log.Info("eviction refused by disruption budget, will retry", "node", d.node, "pod", st.ref.String(),
			"budgets", strings.Join(st.budgets, ","), "reason", st.reason)
		return nil
	case apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		// Evictions in a terminating namespace are refused until the namespace controller
		// deletes the pod.
		st.budgets, st.reason = nil, "namespace is terminating: "+refusal(err)
		return nil
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsBadRequest(err),
		apierrors.IsInvalid(err), apierrors.IsMethodNotSupported(err):
		return fmt.Errorf("evicting pod %s from node %q: %w", st.ref, d.node, err)
	default:
		// Server errors (500 when a pod has several budgets, timeouts, unavailable API server):
		// retried until the drain's time is up.
		if ctx.Err() != nil {
			return ctx.Err()
		}
		st.budgets, st.reason = d.budgetsOf(ctx, p), refusal(err)
		d.opts.Log.Warn("eviction failed, will retry", "node", d.node, "pod", st.ref.String(), "error", st.reason)
		return nil
	}
}

// budgetsOf names the PodDisruptionBudgets that select p, as the eviction handler finds them
// (every budget of the pod's namespace whose selector matches its labels). The 429 only carries
// the name inside a sentence; a drain that times out names the budgets exactly. The list has a
// few seconds of its own: a refusal that arrives as the drain's time runs out is still reported
// with its budgets.
func (d *drainer) budgetsOf(ctx context.Context, p *corev1.Pod) []string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budgetListTimeout)
	defer cancel()
	list, err := d.client.PolicyV1().PodDisruptionBudgets(p.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var names []string
	for _, pdb := range list.Items {
		// As the eviction handler: a nil selector matches nothing, an empty one everything,
		// an invalid one nothing.
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			continue
		}
		if sel.Matches(labels.Set(p.Labels)) {
			names = append(names, pdb.Namespace+"/"+pdb.Name)
		}
	}
	sort.Strings(names)
	return names
}

// budgetListTimeout bounds budgetsOf's list.
const budgetListTimeout = 5 * time.Second

// refusal renders the API server's refusal: its message and the causes it names (for a budget:
// "The disruption budget web needs 2 healthy pods and has 2 currently"), bounded in length.
func refusal(err error) string {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return untrusted.Quote(err.Error())
	}
	s := status.Status()
	msg := s.Message
	if s.Details != nil {
		for _, c := range s.Details.Causes {
			if c.Message != "" {
				msg += " " + c.Message
			}
		}
	}
	const limit = 512
	if len(msg) > limit {
		msg = msg[:limit] + "…"
	}
	return msg
}

func terminatingReason(p *corev1.Pod) string {
	grace := "default grace period"
	if p.DeletionGracePeriodSeconds != nil {
		grace = fmt.Sprintf("grace period %ds", *p.DeletionGracePeriodSeconds)
	}
	return fmt.Sprintf("evicted, still terminating (deletion requested %s, %s)",
		p.DeletionTimestamp.UTC().Format(time.RFC3339), grace)
}

// stopped is the error of a drain whose context ended: a *TimeoutError when its time was up,
// the context's error (wrapped, naming the pods still there) when the caller canceled it.
func (d *drainer) stopped(ctx context.Context, report Report) error {
	e := &TimeoutError{Node: d.node, Timeout: d.timeout, Report: report, LastError: d.lastErr}
	for _, st := range d.seen {
		e.Pods = append(e.Pods, StuckPod{Pod: st.ref, Budgets: st.budgets, Reason: st.reason})
	}
	sort.Slice(e.Pods, func(i, j int) bool { return e.Pods[i].Pod.String() < e.Pods[j].Pod.String() })
	sortRefs(e.Report.Evicted)
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		pods := make([]string, len(e.Pods))
		for i, p := range e.Pods {
			pods[i] = p.String()
		}
		return fmt.Errorf("draining node %q: %w; pods still on the node: %s", d.node, ctx.Err(), strings.Join(pods, "; "))
	}
	return e
}

func sortRefs(refs []PodRef) {
	sort.Slice(refs, func(i, j int) bool { return refs[i].String() < refs[j].String() })
}

// AttachedVolumes lists the volumes attached to node (VolumeAttachment objects naming it, of
// every driver that attaches): what Kubernetes has not detached yet. A drained node's
// kubelet unmounts its evicted pods' volumes and reports it; only then does Kubernetes'
// attach-detach controller detach them at once. A node deleted before that keeps its volumes
// attached for six minutes (the controller's wait for an unmount it can no longer see), and a
// pod that moved to another node cannot start until then.
func AttachedVolumes(ctx context.Context, client kubernetes.Interface, node string) ([]string, error) {
	list, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing volume attachments: %w", err)
	}
	var attached []string
	for _, va := range list.Items {
		if va.Spec.NodeName != node {
			continue
		}
		name := va.Name
		if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
			name = *pv
		}
		attached = append(attached, name)
	}
	sort.Strings(attached)
	return attached, nil
}
