// Package kubeletcred puts a node's kubelet client credential where kubeadm and the kubelet
// read it: the kubeconfig a join discovers the cluster with, the init node's kubelet.conf,
// and the kubelet's own certificate store, which a rebooted or recovered node refreshes
// before the kubelet starts again. The certificates themselves come from
// internal/kube/kubeletcsr (docs/joinservice.md, "Node credentials").
package kubeletcred

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"path/filepath"
	"time"

	"errors"
	"fmt"
	"net"
	"net/url"
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/certificate"

	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/pki"
)

// Where the kubelet's client credential lives on a node (kubeadm's and the kubelet's
// defaults).
const (
	// KubeconfigFile is the kubelet's kubeconfig. kubeadm writes it; the init server
	// writes it first (with the node's short-lived client certificate), and kubeadm init then
	// uses it as it is ("Using existing kubeconfig file").
	KubeconfigFile = "/etc/kubernetes/kubelet.conf"
	// CertDir holds the kubelet's client certificate store: kubelet-client-current.pem
	// (a symlink to the newest kubelet-client-<time>.pem, certificate and key in one file),
	// which kubelet.conf names once kubeadm finished and the kubelet rotates.
	CertDir = "/var/lib/kubelet/pki"
	// clientPairPrefix is the kubelet's name for its client pair in that store.
	clientPairPrefix = "kubelet-client"
)

// KubeconfigParams describe a kubeconfig that authenticates a node with its client certificate.
type KubeconfigParams struct {
	// ClusterName names the cluster (kubeadm's default "kubernetes" when empty).
	ClusterName string
	// Server is the API server's host:port.
	Server string
	// NodeName is the node the certificate is for (the user is system:node:<NodeName>).
	NodeName string
	// CACert, ClientCert and ClientKey are PEM.
	CACert, ClientCert, ClientKey []byte
}

// Kubeconfig returns a kubeconfig with everything embedded: the join discovery file
// (kubeadmconfig.JoinParams.DiscoveryFile) and the init node's kubelet.conf (KubeconfigFile).
func Kubeconfig(p KubeconfigParams) ([]byte, error) {
	if err := validateServer(p.Server); err != nil {
		return nil, fmt.Errorf("kubeconfig server: %w", err)
	}
	if len(p.CACert) == 0 || len(p.ClientCert) == 0 || len(p.ClientKey) == 0 {
		return nil, errors.New("kubeconfig: CA, client certificate and key are required")
	}
	cluster := p.ClusterName
	if cluster == "" {
		cluster = "kubernetes"
	}
	user := kubeletcsr.NodeUserPrefix + p.NodeName
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{
		Server:                   (&url.URL{Scheme: "https", Host: p.Server}).String(),
		CertificateAuthorityData: p.CACert,
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: p.ClientCert, ClientKeyData: p.ClientKey}
	cfg.Contexts[user+"@"+cluster] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user}
	cfg.CurrentContext = user + "@" + cluster
	return clientcmd.Write(*cfg)
}

// StoreKubeletClientCert puts a client certificate and its key into the kubelet's certificate
// store in dir (CertDir), as the kubelet itself does when it rotates: a new
// kubelet-client-<time>.pem, then kubelet-client-current.pem switched to it. A rebooted or
// recovered node does this with the certificate of its rejoin ticket (or its own CA) before
// the kubelet starts, so a node that was off longer than its certificate lived comes back.
func StoreClientCert(dir string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("kubelet certificate directory: %w", err)
	}
	store, err := certificate.NewFileStore(clientPairPrefix, dir, dir, "", "")
	if err != nil {
		return fmt.Errorf("kubelet certificate store %s: %w", dir, err)
	}
	if _, err := store.Update(certPEM, keyPEM); err != nil {
		return fmt.Errorf("storing the kubelet client certificate in %s: %w", dir, err)
	}
	return nil
}

// Issue issues the node named name a fresh client certificate from ca, valid from now for
// kubeletcsr.ClientValidity, with a new key: both PEM.
func Issue(ca *pki.CA, name string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("kubelet client key: %w", err)
	}
	der, err := kubeletcsr.ClientRequest(name, key)
	if err != nil {
		return nil, nil, err
	}
	csr, err := kubeletcsr.CheckClient(der, name)
	if err != nil {
		return nil, nil, err
	}
	cert, err := kubeletcsr.IssueClient(ca, csr, now)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing the kubelet client certificate: %w", err)
	}
	if keyPEM, err = pki.EncodeKey(key); err != nil {
		return nil, nil, err
	}
	return pki.EncodeCert(cert), keyPEM, nil
}

// RenewWithCA issues the node named name a fresh client certificate from the cluster CA in
// pkiDir (ca.crt, ca.key) and stores it in certDir. Only a control plane holds the CA: a
// recovered control plane renews its own credential so, since no join service runs to
// issue it one.
func RenewWithCA(pkiDir, certDir, name string, now time.Time) error {
	ca, err := pki.LoadCA(filepath.Join(pkiDir, pki.CACert), filepath.Join(pkiDir, pki.CAKey))
	if err != nil {
		return fmt.Errorf("renewing the kubelet client certificate: %w", err)
	}
	certPEM, keyPEM, err := Issue(ca, name, now)
	if err != nil {
		return err
	}
	return StoreClientCert(certDir, certPEM, keyPEM)
}

// validateServer checks a "host:port" with a non-empty host and a numeric port.
func validateServer(hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if host == "" || port == "" {
		return fmt.Errorf("%q has no host or no port", hostport)
	}
	return nil
}
