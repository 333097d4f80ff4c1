// Package kubeupgrade moves a cluster to the Kubernetes version of its newest control planes'
// node image, with that image's own kubeadm (docs/upgrades.md "Kubernetes upgrades").
//
// A cluster's Kubernetes version is not a setting the CLI pushes: it follows the node images.
// An upgrade replaces nodes by nodes of a release with a newer version, control planes first;
// every control plane runs a Keeper, which compares what its image runs with what the cluster
// runs and takes the next step, with the node's own measured kubeadm:
//
//  1. The cluster's configuration (kubeadm-config) is older than this node's image: `kubeadm
//     upgrade apply` moves this node's control plane and the cluster's configuration. The
//     other control planes are replaced, not upgraded in place, so this happens once, on the
//     first control plane of the release.
//  2. The cluster runs this version, and kube-proxy (the add-ons) an older one: once every
//     node's kubelet runs this version, `kubeadm upgrade node phase addon all` moves kube-proxy
//     and CoreDNS. Not earlier, because a node runs only the container images of its own and
//     its cluster's versions (the local provider has no registry; docs/local-provider.md
//     "Images"), so an add-on of the new version would not start on a node of the old image.
//
// Everything else is left alone: a cluster newer than the image (an old node that outlived
// the upgrade of its cluster) and a cluster more than one minor older (Kubernetes upgrades one
// minor at a time; the CLI refuses such a release before it boots a node).
//
// Decide is the whole policy, from what Observe read; Keeper.Step acts on it. Each step is
// idempotent (kubeadm re-runs a half-done upgrade), so the loop simply runs again after a
// failure or a reboot.
package kubeupgrade

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/pkg/strictjson"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Where kubeadm keeps the cluster's configuration and the add-ons it deploys.
const (
	Namespace             = "kube-system"
	KubeadmConfigName     = "kubeadm-config"
	ClusterConfigKey      = "ClusterConfiguration"
	KubeProxyName         = "kube-proxy"
	CoreDNSDeploymentName = "coredns"
)

// Skew checks that a cluster may move from Kubernetes current to target: never back, one
// minor at a time (Kubernetes' version skew policy; kubeadm upgrades one minor per step).
func Skew(current, target string) error {
	// The parser's error repeats its input whole: the message names the input itself, bounded.
	cur, err := version.ParseSemantic(current)
	if err != nil {
		return fmt.Errorf("the running version %s does not parse as a version", untrusted.Quote(current))
	}
	tgt, err := version.ParseSemantic(target)
	if err != nil {
		return fmt.Errorf("version %s does not parse as a version", untrusted.Quote(target))
	}
	switch {
	case tgt.LessThan(cur):
		return fmt.Errorf("version %s is older than the running %s: Kubernetes never goes back", shown(target), shown(current))
	case tgt.Major() != cur.Major() || tgt.Minor() > cur.Minor()+1:
		return fmt.Errorf("version %s skips a minor version from the running %s: upgrade one minor at a time", shown(target), shown(current))
	}
	return nil
}

// shown is a version as errors and logs print it. The versions compared here come from the
// cluster: kubeadm's configuration and the add-ons' images are the control planes', but a
// kubelet's version is its node's own report (the Node status each node writes of itself), so
// a compromised node chooses it, any bytes up to the object's size limit (1 MiB and more).
// Every version printed goes through the one rule for a peer's strings (untrusted.Text: one
// line, control characters escaped, bounded), which leaves a real version as it is.
func shown(v string) string { return untrusted.Text(v) }

// Observed is what the cluster runs, as far as the Kubernetes version goes.
type Observed struct {
	// Cluster is the version of kubeadm's ClusterConfiguration: the control plane's, once
	// `kubeadm upgrade apply` succeeded.
	Cluster string
	// KubeProxy is the tag of the kube-proxy DaemonSet's image ("" without kube-proxy):
	// kubeadm moves it and CoreDNS together.
	KubeProxy string
	// Kubelets maps each node to its kubelet's version.
	Kubelets map[string]string
}

// Observe reads what the cluster runs.
func Observe(ctx context.Context, kube kubernetes.Interface) (Observed, error) {
	var o Observed
	var err error
	if o.Cluster, err = ClusterVersion(ctx, kube); err != nil {
		return Observed{}, err
	}
	if o.KubeProxy, err = KubeProxyVersion(ctx, kube); err != nil {
		return Observed{}, err
	}
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return Observed{}, fmt.Errorf("listing the nodes: %w", err)
	}
	o.Kubelets = map[string]string{}
	for _, n := range nodes.Items {
		o.Kubelets[n.Name] = n.Status.NodeInfo.KubeletVersion
	}
	return o, nil
}

// Others returns the versions the cluster runs besides own (its control plane's, kube-proxy's
// and the kubelets'), sorted: a node of own's version that joins must be able to run their
// images too. Only versions a node image can run (kubeversion) are returned: a kubelet's
// version is its node's own report, and one that no supported release has is no version any
// node runs (no image carries its containers); passing it on would only make the replacement's
// creation fail, with the node's string in the error.
func (o Observed) Others(own string) []string {
	seen := map[string]bool{}
	add := func(v string) {
		if _, err := kubeversion.Lookup(v); err == nil && v != own {
			seen[v] = true
		}
	}
	add(o.Cluster)
	add(o.KubeProxy)
	for _, v := range o.Kubelets {
		add(v)
	}
	others := make([]string, 0, len(seen))
	for v := range seen {
		others = append(others, v)
	}
	sort.Strings(others)
	return others
}

// ClusterVersion returns the kubernetesVersion of kubeadm's ClusterConfiguration.
func ClusterVersion(ctx context.Context, kube kubernetes.Interface) (string, error) {
	cm, err := kube.CoreV1().ConfigMaps(Namespace).Get(ctx, KubeadmConfigName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading %s/%s: %w", Namespace, KubeadmConfigName, err)
	}
	var cfg struct {
		KubernetesVersion string `json:"kubernetesVersion"`
	}
	// kubeadm reads the key exactly and refuses it twice: a "KubernetesVersion" beside it, or
	// the key twice, must not make this reading differ from kubeadm's (yaml.Unmarshal alone
	// matches case-insensitively and keeps the last). Other fields are kubeadm's business.
	js, err := yaml.YAMLToJSONStrict([]byte(cm.Data[ClusterConfigKey]))
	if err == nil {
		err = strictjson.UnmarshalIgnoreUnknown(js, &cfg)
	}
	if err != nil {
		return "", fmt.Errorf("%s/%s %s: %w", Namespace, KubeadmConfigName, ClusterConfigKey, err)
	}
	if _, err := version.ParseSemantic(cfg.KubernetesVersion); err != nil {
		return "", fmt.Errorf("%s/%s %s: kubernetesVersion %s does not parse as a version", Namespace, KubeadmConfigName, ClusterConfigKey, untrusted.Quote(cfg.KubernetesVersion))
	}
	return cfg.KubernetesVersion, nil
}

// KubeProxyVersion returns the image tag of the kube-proxy DaemonSet, "" if there is none.
func KubeProxyVersion(ctx context.Context, kube kubernetes.Interface) (string, error) {
	ds, err := kube.AppsV1().DaemonSets(Namespace).Get(ctx, KubeProxyName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the %s DaemonSet: %w", KubeProxyName, err)
	}
	if tag := containerTag(ds.Spec.Template.Spec, KubeProxyName); tag != "" {
		return tag, nil
	}
	return "", fmt.Errorf("the %s DaemonSet has no tagged %s container", KubeProxyName, KubeProxyName)
}

// AddonsAt reports whether kube-proxy and CoreDNS run the images of Kubernetes version and
// have rolled out (no pod of an older template left), and if not, what is missing.
func AddonsAt(ctx context.Context, kube kubernetes.Interface, version string) (bool, string, error) {
	r, err := kubeversion.Lookup(version)
	if err != nil {
		return false, "", err
	}
	var missing []string
	ds, err := kube.AppsV1().DaemonSets(Namespace).Get(ctx, KubeProxyName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, "", fmt.Errorf("reading the %s DaemonSet: %w", KubeProxyName, err)
	default:
		st := ds.Status
		if tag := containerTag(ds.Spec.Template.Spec, KubeProxyName); tag != version {
			missing = append(missing, fmt.Sprintf("kube-proxy runs %s", shown(tag)))
		} else if ds.Generation > st.ObservedGeneration || st.UpdatedNumberScheduled < st.DesiredNumberScheduled || st.NumberAvailable < st.DesiredNumberScheduled {
			missing = append(missing, fmt.Sprintf("kube-proxy %s rolling out: %d of %d nodes updated, %d available",
				version, st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable))
		}
	}
	d, err := kube.AppsV1().Deployments(Namespace).Get(ctx, CoreDNSDeploymentName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, "", fmt.Errorf("reading the %s Deployment: %w", CoreDNSDeploymentName, err)
	default:
		st, want := d.Status, int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		if tag := containerTag(d.Spec.Template.Spec, CoreDNSDeploymentName); tag != r.CoreDNS {
			missing = append(missing, fmt.Sprintf("CoreDNS runs %s, not %s", shown(tag), r.CoreDNS))
		} else if d.Generation > st.ObservedGeneration || st.UpdatedReplicas < want || st.AvailableReplicas < want || st.Replicas > want {
			missing = append(missing, fmt.Sprintf("CoreDNS %s rolling out: %d of %d replicas updated, %d available, %d in all",
				r.CoreDNS, st.UpdatedReplicas, want, st.AvailableReplicas, st.Replicas))
		}
	}
	return len(missing) == 0, strings.Join(missing, "; "), nil
}

func containerTag(spec corev1.PodSpec, name string) string {
	for _, c := range spec.Containers {
		if c.Name == name {
			return nodeimage.Tag(c.Image)
		}
	}
	return ""
}

// Action is the step a control plane takes.
type Action string

// Actions.
const (
	// None: nothing to do here, the Reason says why.
	None Action = "none"
	// ApplyControlPlane: `kubeadm upgrade apply` of this node's version.
	ApplyControlPlane Action = "upgrade-control-plane"
	// ApplyAddons: `kubeadm upgrade node phase addon all`.
	ApplyAddons Action = "upgrade-addons"
)

// Decision is an Action and why.
type Decision struct {
	Action Action
	Reason string
}

// Decide returns the step a control plane whose image runs Kubernetes own takes in a cluster
// that runs o. Its Reason is logged: every version of o in it is printed by the rule for a
// peer's strings (shown; the nodes with older kubelets as an untrusted.QuoteList, at most
// MaxListItems of them, each cut).
func Decide(own string, o Observed) Decision {
	cluster, err := version.ParseSemantic(o.Cluster)
	if err != nil {
		return Decision{None, fmt.Sprintf("the cluster's version %s does not parse as a version", untrusted.Quote(o.Cluster))}
	}
	mine, err := version.ParseSemantic(own)
	if err != nil {
		return Decision{None, fmt.Sprintf("this node's version %s does not parse as a version", untrusted.Quote(own))}
	}
	switch {
	case mine.LessThan(cluster):
		return Decision{None, fmt.Sprintf("the cluster runs %s, newer than this node's %s", shown(o.Cluster), own)}
	case cluster.LessThan(mine):
		if err := Skew(o.Cluster, own); err != nil {
			return Decision{None, fmt.Sprintf("not upgrading the control plane: %v", err)}
		}
		return Decision{ApplyControlPlane, fmt.Sprintf("the cluster runs %s, this node's image %s", shown(o.Cluster), own)}
	}
	if o.KubeProxy == "" || o.KubeProxy == own {
		return Decision{None, "the cluster and its add-ons run " + own}
	}
	var older []string
	for name, v := range o.Kubelets {
		if v != own {
			older = append(older, name+" ("+v+")")
		}
	}
	if len(older) > 0 {
		sort.Strings(older)
		return Decision{None, fmt.Sprintf("the add-ons (kube-proxy %s) move to %s once every node runs it; not yet: %d node(s) %s",
			shown(o.KubeProxy), own, len(older), untrusted.QuoteList(older))}
	}
	return Decision{ApplyAddons, fmt.Sprintf("every node runs %s, kube-proxy %s", own, shown(o.KubeProxy))}
}

// Kubeadm runs this node's kubeadm (internal/kube/kubeadm.Runner).
type Kubeadm interface {
	UpgradeApply(ctx context.Context, config []byte, out io.Writer) error
	UpgradeAddons(ctx context.Context, config []byte, out io.Writer) error
}

// Keeper takes the steps Decide names, on one control plane.
type Keeper struct {
	// Version is the Kubernetes version of this node's image.
	Version string
	Kube    kubernetes.Interface
	Kubeadm Kubeadm
	// Config is the kubeadm upgrade configuration (kubeadmconfig.Upgrade of Version).
	Config []byte
	// Interval is the time between two looks at the cluster (DefaultInterval when zero);
	// after a failed step the keeper waits up to MaxBackoff.
	Interval   time.Duration
	MaxBackoff time.Duration
	Log        *slog.Logger
	// Output receives kubeadm's output (the node's log).
	Output io.Writer
}

// DefaultInterval and DefaultMaxBackoff pace a Keeper.
const (
	DefaultInterval   = 5 * time.Second
	DefaultMaxBackoff = 2 * time.Minute
)

// observeTimeout bounds one look at the cluster, kubeadmTimeout one kubeadm step (kubeadm
// waits up to 5 minutes for each static pod it replaces).
const (
	observeTimeout = 30 * time.Second
	kubeadmTimeout = 20 * time.Minute
)

// Step observes the cluster, decides, and takes the step. It returns the decision and the
// step's error.
func (k *Keeper) Step(ctx context.Context) (Decision, error) {
	octx, cancel := context.WithTimeout(ctx, observeTimeout)
	o, err := Observe(octx, k.Kube)
	cancel()
	if err != nil {
		return Decision{}, err
	}
	d := Decide(k.Version, o)
	ctx, cancel = context.WithTimeout(ctx, kubeadmTimeout)
	defer cancel()
	switch d.Action {
	case ApplyControlPlane:
		k.Log.Info("upgrading the control plane with this node's kubeadm", "to", k.Version, "why", d.Reason)
		err = k.Kubeadm.UpgradeApply(ctx, k.Config, k.Output)
	case ApplyAddons:
		k.Log.Info("upgrading kube-proxy and CoreDNS with this node's kubeadm", "to", k.Version, "why", d.Reason)
		err = k.Kubeadm.UpgradeAddons(ctx, k.Config, k.Output)
	}
	if err != nil {
		return d, fmt.Errorf("%s: %w", d.Action, err)
	}
	if d.Action != None {
		k.Log.Info("Kubernetes upgrade step done", "step", string(d.Action), "to", k.Version)
	}
	return d, nil
}

// Run takes steps until ctx ends: one look every Interval, backing off after failures. A
// decision is logged when it changes, a failure every time.
func (k *Keeper) Run(ctx context.Context) {
	interval, maxBackoff := k.Interval, k.MaxBackoff
	if interval == 0 {
		interval = DefaultInterval
	}
	if maxBackoff == 0 {
		maxBackoff = DefaultMaxBackoff
	}
	wait, last := interval, ""
	for {
		d, err := k.Step(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			k.Log.Warn("Kubernetes upgrade step failed; trying again", "err", err, "in", wait.String())
			wait = min(2*wait, maxBackoff)
		default:
			if d.Reason != last {
				k.Log.Info("Kubernetes version", "decision", string(d.Action), "why", d.Reason)
				last = d.Reason
			}
			wait = interval
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
