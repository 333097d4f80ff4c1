package nodeauthz

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
)

// The API server's side: files in ConfigDir on every control plane, which kubeadm mounts
// into the kube-apiserver pod read-only (internal/kube/kubeadmconfig).
const (
	ConfigDir = "/etc/kubernetes/constellation"
	// AuthorizationConfigFile is the API server's --authorization-config.
	AuthorizationConfigFile = ConfigDir + "/authorization.yaml"
	// WebhookKubeconfigFile tells the API server where the authorizer is and which CA signs
	// its serving certificate.
	WebhookKubeconfigFile = ConfigDir + "/removed-node-authorizer.conf"
)

// Settings of the webhook in the API server.
const (
	// Timeout of one call. The authorizer answers from memory on loopback; a hung one costs
	// each node request this much (and the API server's retries on timeouts).
	Timeout = time.Second
	// CacheTTL of every decision in the API server: a removal takes effect on requests the
	// API server saw before within this time.
	CacheTTL = time.Second
	// Name of the authorizer in the API server's configuration and metrics.
	Name = "constellation-removed-nodes"
)

// AuthorizationConfig returns the API server's authorization configuration: this webhook for
// node identities only, then the Node and RBAC authorizers kubeadm configures by default.
// webhookKubeconfig is the path of WebhookKubeconfig's file as the API server sees it.
func AuthorizationConfig(webhookKubeconfig string) ([]byte, error) {
	cfg := apiserverv1.AuthorizationConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: apiserverv1.SchemeGroupVersion.String(), Kind: "AuthorizationConfiguration"},
		Authorizers: []apiserverv1.AuthorizerConfiguration{
			{
				Type: string(apiserverv1.TypeWebhook), Name: Name,
				Webhook: &apiserverv1.WebhookConfiguration{
					Timeout:                                  metav1.Duration{Duration: Timeout},
					AuthorizedTTL:                            metav1.Duration{Duration: CacheTTL},
					UnauthorizedTTL:                          metav1.Duration{Duration: CacheTTL},
					CacheAuthorizedRequests:                  ptr.To(true),
					CacheUnauthorizedRequests:                ptr.To(true),
					SubjectAccessReviewVersion:               "v1",
					MatchConditionSubjectAccessReviewVersion: "v1",
					FailurePolicy:                            apiserverv1.FailurePolicyNoOpinion,
					ConnectionInfo: apiserverv1.WebhookConnectionInfo{
						Type:           apiserverv1.AuthorizationWebhookConnectionInfoTypeKubeConfigFile,
						KubeConfigFile: ptr.To(webhookKubeconfig),
					},
					// Only nodes' requests reach it: everyone else's are decided as before,
					// without a call.
					MatchConditions: []apiserverv1.WebhookMatchCondition{{
						Expression: fmt.Sprintf("request.user.startsWith(%q)", kubeletcsr.NodeUserPrefix),
					}},
				},
			},
			{Type: "Node", Name: "node"},
			{Type: "RBAC", Name: "rbac"},
		},
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encoding the authorization configuration: %w", err)
	}
	return data, nil
}

// WebhookKubeconfig returns the kubeconfig the API server reaches the authorizer at addr
// (Addr on a control plane) with, over TLS, its certificate checked against caFile (the
// cluster CA, as the API server sees it).
func WebhookKubeconfig(caFile, addr string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[Name] = &clientcmdapi.Cluster{Server: "https://" + addr + Path, CertificateAuthority: caFile}
	cfg.AuthInfos["kube-apiserver"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts[Name] = &clientcmdapi.Context{Cluster: Name, AuthInfo: "kube-apiserver"}
	cfg.CurrentContext = Name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("encoding the authorizer's kubeconfig: %w", err)
	}
	return data, nil
}

// WriteAPIServerFiles writes AuthorizationConfig and WebhookKubeconfig (for the authorizer at
// addr) into dir under their base names, the configuration naming the kubeconfig by its
// path in dir. On a control plane dir is ConfigDir and addr Addr: kubeadm mounts ConfigDir
// into the API server's pod at the same path, and caFile is the cluster CA's path there.
// The init server and the join client of a control plane write them before kubeadm starts
// the API server.
func WriteAPIServerFiles(dir, caFile, addr string) error {
	authz, err := AuthorizationConfig(filepath.Join(dir, filepath.Base(WebhookKubeconfigFile)))
	if err != nil {
		return err
	}
	kubeconfig, err := WebhookKubeconfig(caFile, addr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for name, data := range map[string][]byte{
		filepath.Base(AuthorizationConfigFile): authz,
		filepath.Base(WebhookKubeconfigFile):   kubeconfig,
	} {
		if err := fileutil.WriteAtomic(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("writing the API server's %s: %w", name, err)
		}
	}
	return nil
}
