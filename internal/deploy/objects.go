package deploy

import (
	"fmt"
	"path"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
)

// Names of the deployed objects. Each service has a ServiceAccount and a DaemonSet of its name;
// the join service also a Role and RoleBinding.
const (
	JoinService         = "constellation-join-service"
	KeyService          = "constellation-key-service"
	VerificationService = "constellation-verification-service"
)

// DaemonSets lists the DaemonSets Apply creates, in the order Wait checks them.
var DaemonSets = []string{KeyService, JoinService, VerificationService, CSIController}

// Ports and paths of the local-provider contract (docs/local-provider.md). The services run
// with the node's network (hostNetwork), so these are node ports.
const (
	JoinServicePort      = 30090
	KeyServicePort       = 9001 // bound to 127.0.0.1
	VerificationGRPCPort = 30081
	VerificationHTTPPort = 30080
	APIServerPort        = 6443
	PKIDir               = "/etc/kubernetes/pki"
)

// BinDir is where the services image holds the three binaries (joinservice, keyservice,
// verificationservice).
const BinDir = "/usr/local/bin"

// Mount points inside the containers.
const (
	configDir        = "/etc/constellation/config"
	keyServiceTLSDir = "/etc/constellation/keyservice-tls"
	masterSecretDir  = "/etc/constellation/mastersecret"
)

// Labels.
const (
	nameLabel      = "app.kubernetes.io/name"
	partOfLabel    = "app.kubernetes.io/part-of"
	managedByLabel = "app.kubernetes.io/managed-by"
	// FieldManager owns every field Apply sets.
	FieldManager = "constellation"
)

const controlPlaneLabel = "node-role.kubernetes.io/control-plane"

// nonRootUser runs the key service: it needs no privilege, only its two Secrets.
const nonRootUser = 65532

func labels(name string) map[string]string {
	return map[string]string{nameLabel: name, partOfLabel: "constellation", managedByLabel: FieldManager}
}

func serviceAccount(name string, token bool) *corev1ac.ServiceAccountApplyConfiguration {
	return corev1ac.ServiceAccount(name, clusterrecord.Namespace).WithLabels(labels(name)).WithAutomountServiceAccountToken(token)
}

// joinServiceRole is what the join service may do, and nothing more: in the disk-owner
// namespace, create and read the records of which node a state disk belongs to and read
// the removed-node records (internal/diskowner). RBAC cannot restrict create by name, and
// the record names are not known in advance, so the records live in a namespace of their
// own: there, creating a ConfigMap plants nothing that another component reads. No update or
// delete: a record, once written, stays. Nothing in kube-system: the service creates no
// bootstrap tokens (a node joins with the client certificate of its ticket).
func joinServiceRole() *rbacv1ac.RoleApplyConfiguration {
	return rbacv1ac.Role(JoinService, diskowner.Namespace).WithLabels(labels(JoinService)).
		WithRules(rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("configmaps").WithVerbs("create", "get"))
}

// diskOwnerNamespace holds the disk-owner records (init creates it first, to record its own
// disk; deploy applies it so that the join service's Role there has a home).
func diskOwnerNamespace() *corev1ac.NamespaceApplyConfiguration {
	return corev1ac.Namespace(diskowner.Namespace).WithLabels(labels(JoinService))
}

func joinServiceRoleBinding() *rbacv1ac.RoleBindingApplyConfiguration {
	return rbacv1ac.RoleBinding(JoinService, diskowner.Namespace).WithLabels(labels(JoinService)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(JoinService)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(JoinService).WithNamespace(clusterrecord.Namespace))
}

// joinRefusalsRole lets the join service publish its refusals for the CLI
// (internal/joinservice/refusals): patch (server-side apply) of the one ConfigMap deploy
// creates for them, by name, and nothing else in kube-system. Without create it can make
// no object there, that one included.
func joinRefusalsRole() *rbacv1ac.RoleApplyConfiguration {
	return rbacv1ac.Role(joinRefusalsName, clusterrecord.Namespace).WithLabels(labels(JoinService)).
		WithRules(rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("configmaps").WithResourceNames(refusals.ConfigMapName).WithVerbs("patch"))
}

func joinRefusalsRoleBinding() *rbacv1ac.RoleBindingApplyConfiguration {
	return rbacv1ac.RoleBinding(joinRefusalsName, clusterrecord.Namespace).WithLabels(labels(JoinService)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(joinRefusalsName)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(JoinService).WithNamespace(clusterrecord.Namespace))
}

// joinRefusalsName names the join service's Role and RoleBinding for its refusals.
const joinRefusalsName = JoinService + "-refusals"

// joinRefusalsConfigMap is where the join services publish their refusals, each under its
// node's key (internal/joinservice/refusals). Deploy applies it without data, so it owns
// none of the services' keys.
func joinRefusalsConfigMap() *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(refusals.ConfigMapName, refusals.Namespace).WithLabels(labels(JoinService))
}

// RegistriesConfigMap is ConfigMap constellation-registries with the encoded registry mirrors
// (registries.Mirrors.Encode), as deploy writes it at init and `apply` when they change.
func RegistriesConfigMap(encoded string) *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(clusterrecord.RegistriesConfigMapName, clusterrecord.Namespace).
		WithLabels(labels(JoinService)).WithData(map[string]string{clusterrecord.RegistryMirrorsKey: encoded})
}

func attestationConfigMap(data map[string]string) *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(clusterrecord.AttestationConfigMapName, clusterrecord.Namespace).
		WithLabels(labels(JoinService)).WithData(data)
}

// daemonSet is the frame every service shares: host network and the node's DNS (joining
// nodes reach the join service before they have a pod network; the services reach the API
// server at the node's own address, not through kube-proxy or cluster DNS), the image never
// pulled (it is imported into every node's containerd), node-critical priority, one pod per
// node rolled one node at a time.
func daemonSet(name string, pod *corev1ac.PodSpecApplyConfiguration) *appsv1ac.DaemonSetApplyConfiguration {
	pod.WithHostNetwork(true).
		WithDNSPolicy(corev1.DNSDefault).
		WithServiceAccountName(name).
		WithPriorityClassName("system-node-critical").
		WithTerminationGracePeriodSeconds(10)
	return appsv1ac.DaemonSet(name, clusterrecord.Namespace).WithLabels(labels(name)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{nameLabel: name})).
			WithUpdateStrategy(appsv1ac.DaemonSetUpdateStrategy().WithType(appsv1.RollingUpdateDaemonSetStrategyType).
				WithRollingUpdate(appsv1ac.RollingUpdateDaemonSet().WithMaxUnavailable(intstr.FromInt32(1)))).
			WithTemplate(corev1ac.PodTemplateSpec().WithLabels(labels(name)).WithSpec(pod)))
}

// onControlPlanes restricts a pod to control-plane nodes, whose taint it tolerates.
func onControlPlanes(pod *corev1ac.PodSpecApplyConfiguration) *corev1ac.PodSpecApplyConfiguration {
	return pod.WithNodeSelector(map[string]string{controlPlaneLabel: ""}).
		WithTolerations(corev1ac.Toleration().WithKey(controlPlaneLabel).WithOperator(corev1.TolerationOpExists).WithEffect(corev1.TaintEffectNoSchedule))
}

func container(name, image, binary string, args ...string) *corev1ac.ContainerApplyConfiguration {
	return corev1ac.Container().WithName(name).WithImage(image).WithImagePullPolicy(corev1.PullNever).
		WithCommand(path.Join(BinDir, binary)).WithArgs(args...).
		WithEnv(corev1ac.EnvVar().WithName("NODE_NAME").WithValueFrom(fieldRef("spec.nodeName")))
}

func fieldRef(p string) *corev1ac.EnvVarSourceApplyConfiguration {
	return corev1ac.EnvVarSource().WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath(p))
}

// restricted is the container security context of every service: no privilege escalation,
// no capabilities, read-only root, the runtime's seccomp profile. The join and verification
// services run as root (uid 0, still without capabilities) only because the files they need
// on the node are root's: the cluster CA key (0600) and the TPM socket.
func restricted(user int64) *corev1ac.SecurityContextApplyConfiguration {
	sc := corev1ac.SecurityContext().
		WithAllowPrivilegeEscalation(false).
		WithReadOnlyRootFilesystem(true).
		WithCapabilities(corev1ac.Capabilities().WithDrop("ALL")).
		WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault)).
		WithRunAsUser(user).WithRunAsGroup(user)
	if user != 0 {
		sc.WithRunAsNonRoot(true)
	}
	return sc
}

// tcpProbe checks every second that the service accepts connections: a TCP connect is cheap,
// and the first probe after the container starts decides when the service counts as ready, so
// init's wait for the services and a node's readiness follow its start within about a second
// (every 5 s, they lagged up to 10 s: the kubelet's first probe waits a random part of the
// period).
func tcpProbe(host string, port int32) *corev1ac.ProbeApplyConfiguration {
	a := corev1ac.TCPSocketAction().WithPort(intstr.FromInt32(port))
	if host != "" {
		a.WithHost(host)
	}
	return corev1ac.Probe().WithTCPSocket(a).WithPeriodSeconds(1).WithFailureThreshold(3)
}

func keyServiceTLSVolume(cert, key string) *corev1ac.VolumeApplyConfiguration {
	return corev1ac.Volume().WithName("keyservice-tls").WithSecret(corev1ac.SecretVolumeSource().
		WithSecretName(clusterrecord.KeyServiceTLSSecretName).WithDefaultMode(0o440).
		WithItems(
			corev1ac.KeyToPath().WithKey(clusterrecord.KeyServiceCAKey).WithPath(clusterrecord.KeyServiceCAKey),
			corev1ac.KeyToPath().WithKey(cert).WithPath(cert),
			corev1ac.KeyToPath().WithKey(key).WithPath(key),
		))
}

// keyServiceDaemonSet: on every control-plane node, serving 127.0.0.1:9001 to the join
// service of the same node. It reads the master secret and its TLS pair from Secrets and
// needs no API access (no token mounted).
func keyServiceDaemonSet(p params) *appsv1ac.DaemonSetApplyConfiguration {
	c := container("keyservice", p.image, "keyservice",
		fmt.Sprintf("--listen=127.0.0.1:%d", KeyServicePort),
		"--master-secret="+path.Join(masterSecretDir, clusterrecord.MasterSecretKey),
		"--tls-dir="+keyServiceTLSDir,
		"--log-level="+p.logLevel,
	).WithSecurityContext(restricted(nonRootUser)).
		WithReadinessProbe(tcpProbe("127.0.0.1", KeyServicePort)).
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName("mastersecret").WithMountPath(masterSecretDir).WithReadOnly(true),
			corev1ac.VolumeMount().WithName("keyservice-tls").WithMountPath(keyServiceTLSDir).WithReadOnly(true),
		)
	pod := onControlPlanes(corev1ac.PodSpec()).
		WithAutomountServiceAccountToken(false).
		WithSecurityContext(corev1ac.PodSecurityContext().WithFSGroup(nonRootUser)).
		WithContainers(c).
		WithVolumes(
			corev1ac.Volume().WithName("mastersecret").WithSecret(corev1ac.SecretVolumeSource().
				WithSecretName(clusterrecord.MasterSecretName).WithDefaultMode(0o440).
				WithItems(corev1ac.KeyToPath().WithKey(clusterrecord.MasterSecretKey).WithPath(clusterrecord.MasterSecretKey))),
			keyServiceTLSVolume(clusterrecord.KeyServiceCertKey, clusterrecord.KeyServiceKeyKey),
		)
	return daemonSet(KeyService, pod)
}

// joinServiceDaemonSet: on every control-plane node. Its configuration is one directory
// projected from the cluster record and the attestation ConfigMap (kubelet swaps it
// atomically, so the reference-set watcher sees consistent files). It talks to the API
// server of its own node (KUBERNETES_SERVICE_HOST = status.hostIP), names the cluster's API
// endpoint in its tickets (Config.APIServerEndpoint), signs with the cluster CA
// from the node's PKI directory, and attests with the node's TPM (ECC AK, opened per use).
func joinServiceDaemonSet(p params) *appsv1ac.DaemonSetApplyConfiguration {
	c := container("joinservice", p.image, "joinservice",
		slices.Concat([]string{
			fmt.Sprintf("--listen=:%d", JoinServicePort),
			"--config-dir=" + configDir,
			"--pki-dir=" + PKIDir,
		}, p.platform.attestationFlags(), []string{
			"--platform=" + p.platform.Name,
			"--metadata-url=" + p.platform.MetadataURL,
			fmt.Sprintf("--key-service=127.0.0.1:%d", KeyServicePort),
			"--key-service-tls-dir=" + keyServiceTLSDir,
			"--api-server-endpoint=" + p.apiServerEndpoint,
			"--log-level=" + p.logLevel,
		})...,
	).WithEnv(
		corev1ac.EnvVar().WithName("HOST_IP").WithValueFrom(fieldRef("status.hostIP")),
		corev1ac.EnvVar().WithName("KUBERNETES_SERVICE_HOST").WithValueFrom(fieldRef("status.hostIP")),
		corev1ac.EnvVar().WithName("KUBERNETES_SERVICE_PORT").WithValue(fmt.Sprint(APIServerPort)),
	).WithSecurityContext(restricted(0)).
		// No readiness probe: a probe connection is a failed attested handshake, which the
		// join service logs and counts as a refused admission. The service checks its whole
		// configuration before it listens and exits on any problem.
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName("config").WithMountPath(configDir).WithReadOnly(true),
			corev1ac.VolumeMount().WithName("keyservice-tls").WithMountPath(keyServiceTLSDir).WithReadOnly(true),
			corev1ac.VolumeMount().WithName("pki").WithMountPath(PKIDir).WithReadOnly(true),
		).
		WithVolumeMounts(p.platform.attestationMounts()...)
	pod := onControlPlanes(corev1ac.PodSpec()).
		WithAutomountServiceAccountToken(true).
		WithContainers(c).
		WithVolumes(
			corev1ac.Volume().WithName("config").WithProjected(corev1ac.ProjectedVolumeSource().WithDefaultMode(0o444).WithSources(
				corev1ac.VolumeProjection().WithConfigMap(corev1ac.ConfigMapProjection().WithName(clusterrecord.ClusterConfigMapName).
					WithItems(corev1ac.KeyToPath().WithKey(clusterrecord.ClusterKey).WithPath(clusterrecord.ClusterKey))),
				corev1ac.VolumeProjection().WithConfigMap(corev1ac.ConfigMapProjection().WithName(clusterrecord.AttestationConfigMapName).
					WithItems(
						corev1ac.KeyToPath().WithKey(clusterrecord.VariantKey).WithPath(clusterrecord.VariantKey),
						corev1ac.KeyToPath().WithKey(clusterrecord.ReferenceSetsKey).WithPath(clusterrecord.ReferenceSetsKey),
						corev1ac.KeyToPath().WithKey(clusterrecord.AKRootsKey).WithPath(clusterrecord.AKRootsKey),
						corev1ac.KeyToPath().WithKey(clusterrecord.HardwareKey).WithPath(clusterrecord.HardwareKey),
					)),
				// Optional: a cluster deployed before registry mirrors has no such ConfigMap.
				corev1ac.VolumeProjection().WithConfigMap(corev1ac.ConfigMapProjection().WithName(clusterrecord.RegistriesConfigMapName).
					WithOptional(true).
					WithItems(corev1ac.KeyToPath().WithKey(clusterrecord.RegistryMirrorsKey).WithPath(clusterrecord.RegistryMirrorsKey))),
			)),
			keyServiceTLSVolume(clusterrecord.JoinServiceCertKey, clusterrecord.JoinServiceKeyKey),
			corev1ac.Volume().WithName("pki").WithHostPath(corev1ac.HostPathVolumeSource().WithPath(PKIDir).WithType(corev1.HostPathDirectory)),
		).
		WithVolumes(p.platform.attestationVolumes()...)
	return daemonSet(JoinService, pod)
}

// verificationServiceDaemonSet: on every node, whatever its taints, answering nonces with
// the node's evidence (RSA AK, the node's own; TPM opened per request).
func verificationServiceDaemonSet(p params) *appsv1ac.DaemonSetApplyConfiguration {
	c := container("verificationservice", p.image, "verificationservice",
		slices.Concat([]string{
			fmt.Sprintf("--grpc-listen=:%d", VerificationGRPCPort),
			fmt.Sprintf("--http-listen=:%d", VerificationHTTPPort),
		}, p.platform.attestationFlags(), []string{
			"--variant=" + p.variant,
			"--log-level=" + p.logLevel,
		})...,
	).WithSecurityContext(restricted(0)).
		WithReadinessProbe(tcpProbe("", VerificationGRPCPort)).
		WithVolumeMounts(p.platform.attestationMounts()...)
	pod := corev1ac.PodSpec().
		WithTolerations(corev1ac.Toleration().WithOperator(corev1.TolerationOpExists)).
		WithAutomountServiceAccountToken(false).
		WithContainers(c).
		WithVolumes(p.platform.attestationVolumes()...)
	return daemonSet(VerificationService, pod)
}
