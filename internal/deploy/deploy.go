// Package deploy deploys the in-cluster services (docs/design.md "1.4 The in-cluster
// services"): the join service and the key service on every control-plane node, the
// verification service on every node, with what they need in kube-system (docs/services.md).
//
// The manifests are Go values (client-go's typed apply configurations), compiled into the
// binary, not YAML templates: field names and types are checked by the compiler, parameters
// (image, reference values, PEM) are set as values and cannot break the YAML they would be
// spliced into, and server-side apply needs neither discovery nor a dynamic client. Render
// prints them as YAML for review.
//
// Apply is server-side apply with field manager "constellation" and forced conflicts, so it is
// idempotent and takes over fields someone else changed. It reuses what init recorded (Secret
// constellation-mastersecret, ConfigMap constellation-cluster) instead of copying it, writes
// the attestation ConfigMap (updated on upgrades), and creates the key service's TLS Secret
// once.
package deploy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
)

// Config parameterizes the deployment.
type Config struct {
	// Image is the services image, e.g. localhost/constellation/services:<content hash>. It
	// is never pulled (imagePullPolicy Never): every node imports it into its containerd. A
	// tag or digest is required.
	Image string
	// Attestation is what the join service admits nodes by: written to ConfigMap
	// constellation-attestation.
	Attestation choose.Reference
	// Platform are the facts of the node platform the services run on (required): its name
	// and metadata service, its nodes' TPM and event log.
	Platform PlatformFacts
	// APIServerEndpoint is host:port of the API server the join service names in its tickets,
	// where joining nodes reach the cluster (kubelet.conf and kubeadm's discovery): the
	// cluster's controlPlaneEndpoint. Default: the address of the node the join service runs
	// on, port 6443.
	APIServerEndpoint string
	// RegistryMirrors are the cluster's registry mirrors, written to ConfigMap
	// constellation-registries for the join service's tickets.
	RegistryMirrors registries.Mirrors
	// LogLevel of the services: debug, info, warn or error (default info).
	LogLevel string
	// WaitTimeout, when positive, makes Run wait that long for the DaemonSets to be ready.
	WaitTimeout time.Duration
	// SkipCSIControllerWait leaves the encrypted-volume driver's controller (DaemonSet
	// CSIController) out of Run's wait: it is applied all the same. By default Run waits
	// for it with the services: a cluster whose default StorageClass cannot provision is
	// not ready for workloads.
	SkipCSIControllerWait bool
	// Now is the time the key service's certificates start (default time.Now).
	Now func() time.Time
}

// params are the checked values the manifests are rendered with.
type params struct {
	image, logLevel, variant string
	platform                 PlatformFacts
	apiServerEndpoint        string
	attestation              map[string]string
	registryMirrors          string // encoded (registries.Mirrors.Encode)
}

func (c Config) params() (params, error) {
	var problems []error
	if !nodeimage.IsPinnedRef(c.Image) {
		problems = append(problems, fmt.Errorf("image %q: want registry/name:tag or registry/name@sha256:digest", c.Image))
	}
	data, err := clusterrecord.AttestationData(c.Attestation)
	if err != nil {
		problems = append(problems, err)
	}
	p := params{image: c.Image, platform: c.Platform, logLevel: c.LogLevel, variant: c.Attestation.Variant.String(), attestation: data,
		apiServerEndpoint: c.APIServerEndpoint}
	if mirrors, err := c.RegistryMirrors.Encode(); err != nil {
		problems = append(problems, fmt.Errorf("registry mirrors: %w", err))
	} else {
		p.registryMirrors = string(mirrors)
	}
	if p.apiServerEndpoint == "" {
		p.apiServerEndpoint = fmt.Sprintf("$(HOST_IP):%d", APIServerPort)
	} else if _, err := netip.ParseAddrPort(p.apiServerEndpoint); err != nil {
		problems = append(problems, fmt.Errorf("API server endpoint %q: want IP:port", p.apiServerEndpoint))
	}
	if err := c.Platform.Validate(); err != nil {
		problems = append(problems, err)
	}
	switch p.logLevel {
	case "":
		p.logLevel = "info"
	case "debug", "info", "warn", "error":
	default:
		problems = append(problems, fmt.Errorf("log level %q: want debug, info, warn or error", p.logLevel))
	}
	if len(problems) > 0 {
		return params{}, fmt.Errorf("deploy: %w", errors.Join(problems...))
	}
	return p, nil
}

// object is one manifest: what it is, and how to apply it.
type object struct {
	kind, name string
	namespace  string // "" for a cluster-scoped object
	manifest   any
	apply      func(ctx context.Context, c kubernetes.Interface, opts metav1.ApplyOptions) error
}

func (o object) String() string {
	if o.namespace == "" {
		return fmt.Sprintf("%s %s", o.kind, o.name)
	}
	return fmt.Sprintf("%s %s/%s", o.kind, o.namespace, o.name)
}

// objects returns the manifests in the order they are applied: identities and permissions,
// configuration, then the workloads that use them; then the node-local StorageClass's, then
// the encrypted-volume driver's with the default StorageClass (after local-path stopped being
// the default, so that the cluster never has two).
func objects(p params) ([]object, error) {
	ns := clusterrecord.Namespace
	var objs []object
	for _, sa := range []struct {
		name  string
		token bool
	}{{KeyService, false}, {JoinService, true}, {VerificationService, false}} {
		ac := serviceAccount(sa.name, sa.token)
		objs = append(objs, object{"ServiceAccount", sa.name, ns, ac, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.CoreV1().ServiceAccounts(ns).Apply(ctx, ac, o)
			return err
		}})
	}
	cm := attestationConfigMap(p.attestation)
	mirrorsCM := RegistriesConfigMap(p.registryMirrors)
	disks := diskOwnerNamespace()
	objs = append(objs, object{"Namespace", diskowner.Namespace, "", disks, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
		_, err := c.CoreV1().Namespaces().Apply(ctx, disks, o)
		return err
	}})
	role, binding := joinServiceRole(), joinServiceRoleBinding()
	objs = append(objs,
		object{"Role", JoinService, diskowner.Namespace, role, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().Roles(diskowner.Namespace).Apply(ctx, role, o)
			return err
		}},
		object{"RoleBinding", JoinService, diskowner.Namespace, binding, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().RoleBindings(diskowner.Namespace).Apply(ctx, binding, o)
			return err
		}})
	refusalsRole, refusalsBinding := joinRefusalsRole(), joinRefusalsRoleBinding()
	objs = append(objs,
		object{"Role", joinRefusalsName, ns, refusalsRole, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().Roles(ns).Apply(ctx, refusalsRole, o)
			return err
		}},
		object{"RoleBinding", joinRefusalsName, ns, refusalsBinding, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().RoleBindings(ns).Apply(ctx, refusalsBinding, o)
			return err
		}})
	objs = append(objs, joinServiceVolumeObjects()...)
	objs = append(objs, nodeIdentityObjects()...)
	refusalsCM := joinRefusalsConfigMap()
	objs = append(objs,
		object{"ConfigMap", clusterrecord.AttestationConfigMapName, ns, cm, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.CoreV1().ConfigMaps(ns).Apply(ctx, cm, o)
			return err
		}},
		object{"ConfigMap", refusals.ConfigMapName, ns, refusalsCM, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.CoreV1().ConfigMaps(ns).Apply(ctx, refusalsCM, o)
			return err
		}},
		object{"ConfigMap", clusterrecord.RegistriesConfigMapName, ns, mirrorsCM, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.CoreV1().ConfigMaps(ns).Apply(ctx, mirrorsCM, o)
			return err
		}},
	)
	for _, ds := range []*appsv1ac.DaemonSetApplyConfiguration{keyServiceDaemonSet(p), joinServiceDaemonSet(p), verificationServiceDaemonSet(p)} {
		objs = append(objs, object{"DaemonSet", *ds.Name, ns, ds, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.AppsV1().DaemonSets(ns).Apply(ctx, ds, o)
			return err
		}})
	}
	storage, err := storageObjects(p)
	if err != nil {
		return nil, err
	}
	return append(append(objs, storage...), csiObjects(p)...), nil
}

// Render returns the manifests Apply applies, as one YAML stream, for review. The key
// service's TLS Secret is not among them: Apply generates it once, in the cluster.
func Render(cfg Config) ([]byte, error) {
	p, err := cfg.params()
	if err != nil {
		return nil, err
	}
	objs, err := objects(p)
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, o := range objs {
		y, err := yaml.Marshal(o.manifest)
		if err != nil {
			return nil, fmt.Errorf("rendering %s: %w", o, err)
		}
		out = append(append(out, "---\n"...), y...)
	}
	return out, nil
}

// Apply applies every object, in order, stopping at the first the API server refuses; the
// error names that object. Before that it checks that init's records exist (the workloads
// mount them) and creates the key service's TLS Secret if it does not exist yet. progress,
// if not nil, receives one line per object.
func Apply(ctx context.Context, client kubernetes.Interface, cfg Config, progress func(string)) error {
	if progress == nil {
		progress = func(string) {}
	}
	p, err := cfg.params()
	if err != nil {
		return err
	}
	if err := checkRecords(ctx, client); err != nil {
		return err
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	created, err := ensureKeyServiceTLS(ctx, client, now())
	if err != nil {
		return err
	}
	if created {
		progress(fmt.Sprintf("created Secret %s/%s (key service TLS)", clusterrecord.Namespace, clusterrecord.KeyServiceTLSSecretName))
	}
	objs, err := objects(p)
	if err != nil {
		return err
	}
	opts := metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
	for _, o := range objs {
		if err := o.apply(ctx, client, opts); err != nil {
			return fmt.Errorf("deploy: applying %s: %w", o, err)
		}
		progress("applied " + o.String())
	}
	return nil
}

// checkRecords fails clearly when init's records are missing: the pods would otherwise wait
// for their volumes without saying why.
func checkRecords(ctx context.Context, client kubernetes.Interface) error {
	ns := clusterrecord.Namespace
	var problems []error
	if _, err := client.CoreV1().Secrets(ns).Get(ctx, clusterrecord.MasterSecretName, metav1.GetOptions{}); err != nil {
		problems = append(problems, fmt.Errorf("init's Secret %s/%s: %w", ns, clusterrecord.MasterSecretName, err))
	}
	if _, err := client.CoreV1().ConfigMaps(ns).Get(ctx, clusterrecord.ClusterConfigMapName, metav1.GetOptions{}); err != nil {
		problems = append(problems, fmt.Errorf("init's ConfigMap %s/%s: %w", ns, clusterrecord.ClusterConfigMapName, err))
	}
	if len(problems) > 0 {
		return fmt.Errorf("deploy: %w", errors.Join(problems...))
	}
	return nil
}

// Wait waits until every named DaemonSet (all of DaemonSets when none is named) is ready:
// the controller has seen its current generation, and on every node it targets (at least
// one) an up-to-date pod is available. When ctx ends first, the error names each DaemonSet
// that is not ready and how far it got.
func Wait(ctx context.Context, client kubernetes.Interface, interval time.Duration, names ...string) error {
	return wait(ctx, client, interval, nil, names)
}

// reportEvery is how often a wait with a progress function says what it still waits for.
const reportEvery = 5 * time.Second

// wait is Wait that, when progress is set, names what is not ready yet every reportEvery.
func wait(ctx context.Context, client kubernetes.Interface, interval time.Duration, progress func(string), names []string) error {
	if len(names) == 0 {
		names = DaemonSets
	}
	if interval <= 0 {
		interval = time.Second
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	// The last thing learned about each DaemonSet that is not ready: a check cut short by
	// the end of ctx does not replace it, so the error tells how far each one got.
	last := map[string]error{}
	start := time.Now()
	reported := start.Add(-reportEvery) // the first pass that finds one not ready says so
	for {
		ready := true
		for _, name := range names {
			err := daemonSetReady(ctx, client, name)
			if err != nil && ctx.Err() != nil {
				// Cut short: keep what is known.
				if _, known := last[name]; !known {
					last[name] = err
				}
				ready = false
				continue
			}
			last[name] = err
			ready = ready && err == nil
		}
		if ready {
			return nil
		}
		if progress != nil && time.Since(reported) >= reportEvery {
			reported = time.Now()
			pending := strings.ReplaceAll(pendingErr(names, last).Error(), "\n", "; ")
			progress(fmt.Sprintf("waiting for the services (%s): %s", time.Since(start).Round(time.Second), pending))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("deploy: waiting for the services: %w: %w", ctx.Err(), pendingErr(names, last))
		case <-ticker.C:
		}
	}
}

// pendingErr joins what was last learned of each DaemonSet that is not ready, in names' order.
func pendingErr(names []string, last map[string]error) error {
	var pending []error
	for _, name := range names {
		if last[name] != nil {
			pending = append(pending, last[name])
		}
	}
	return errors.Join(pending...)
}

func daemonSetReady(ctx context.Context, client kubernetes.Interface, name string) error {
	ds, err := client.AppsV1().DaemonSets(clusterrecord.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("DaemonSet %s/%s does not exist", clusterrecord.Namespace, name)
	}
	if err != nil {
		return fmt.Errorf("DaemonSet %s/%s: %w", clusterrecord.Namespace, name, err)
	}
	st := ds.Status
	switch {
	case st.ObservedGeneration < ds.Generation:
		return fmt.Errorf("DaemonSet %s/%s: generation %d not yet observed by the controller (observed %d)", ds.Namespace, name, ds.Generation, st.ObservedGeneration)
	case st.DesiredNumberScheduled == 0:
		return fmt.Errorf("DaemonSet %s/%s: targets no node yet", ds.Namespace, name)
	case st.UpdatedNumberScheduled < st.DesiredNumberScheduled || st.NumberAvailable < st.DesiredNumberScheduled:
		return fmt.Errorf("DaemonSet %s/%s: %d of %d pods up to date, %d available", ds.Namespace, name, st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable)
	}
	return nil
}

// Run deploys with the admin kubeconfig: Apply, then, if cfg.WaitTimeout is positive, Wait
// that long. It is what the init server calls after `kubeadm init`.
func Run(ctx context.Context, kubeconfig []byte, cfg Config, progress func(string)) error {
	if progress == nil {
		progress = func(string) {}
	}
	restCfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return fmt.Errorf("deploy: admin kubeconfig: %w", err)
	}
	restCfg.Timeout = 30 * time.Second
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("deploy: admin kubeconfig: %w", err)
	}
	if err := Apply(ctx, client, cfg, progress); err != nil {
		return err
	}
	if cfg.WaitTimeout <= 0 {
		return nil
	}
	progress(fmt.Sprintf("waiting up to %s for the services to be ready", cfg.WaitTimeout.Round(time.Second)))
	wctx, cancel := context.WithTimeout(ctx, cfg.WaitTimeout)
	defer cancel()
	names := DaemonSets
	if cfg.SkipCSIControllerWait {
		names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == CSIController })
	}
	if err := wait(wctx, client, 500*time.Millisecond, progress, names); err != nil {
		return err
	}
	if cfg.SkipCSIControllerWait {
		progress("join, key and verification services ready")
	} else {
		progress("join, key and verification services and the volume driver's controller ready")
	}
	return nil
}
