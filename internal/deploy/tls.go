package deploy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/kms/keyservice"
	"github.com/openconstellation/constellation/internal/pki"
)

// Names in the key service's certificates. The key service's policy grants keys by the
// client certificate's common name (docs/joinservice.md).
const (
	KeyServiceServerName = "constellation-key-service"
	JoinServiceClientCN  = keyservice.JoinServiceClient
)

// keyServiceTLSValidity: there is no rotation yet, so the pair lives as long as a kubeadm CA.
const keyServiceTLSValidity = 10 * 365 * 24 * time.Hour

// NewKeyServiceTLS makes the key service's mutual TLS material: a CA made for it alone, its
// server pair (127.0.0.1 and KeyServiceServerName) and the join service's client pair. The
// CA's key is dropped once both are signed, so no further client can ever be certified: the
// only way in is this Secret.
func NewKeyServiceTLS(now time.Time) (map[string][]byte, error) {
	ca, err := pki.NewCA("constellation key service CA", now, keyServiceTLSValidity)
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{clusterrecord.KeyServiceCAKey: pki.EncodeCert(ca.Cert)}
	for _, leaf := range []struct {
		certKey, keyKey string
		l               pki.Leaf
	}{
		{clusterrecord.KeyServiceCertKey, clusterrecord.KeyServiceKeyKey, pki.Leaf{
			CommonName: KeyServiceServerName, DNSNames: []string{KeyServiceServerName, "localhost"},
			IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, Server: true,
		}},
		{clusterrecord.JoinServiceCertKey, clusterrecord.JoinServiceKeyKey, pki.Leaf{CommonName: JoinServiceClientCN, Client: true}},
	} {
		leaf.l.NotBefore, leaf.l.NotAfter = now.Add(-time.Minute), now.Add(keyServiceTLSValidity)
		cert, key, err := ca.NewLeaf(leaf.l)
		if err != nil {
			return nil, err
		}
		keyPEM, err := pki.EncodeKey(key)
		if err != nil {
			return nil, err
		}
		data[leaf.certKey], data[leaf.keyKey] = pki.EncodeCert(cert), keyPEM
	}
	return data, nil
}

// ensureKeyServiceTLS creates the key service's TLS Secret unless it exists. An existing one
// is kept (re-applying must not re-key a running key service) after checking that both pairs
// are there, match, chain to its CA and are valid now; otherwise the error names the Secret.
func ensureKeyServiceTLS(ctx context.Context, client kubernetes.Interface, now time.Time) (created bool, err error) {
	ns, name := clusterrecord.Namespace, clusterrecord.KeyServiceTLSSecretName
	existing, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		if err := CheckKeyServiceTLS(existing.Data, now); err != nil {
			return false, fmt.Errorf("deploy: Secret %s/%s exists but is unusable (delete it to have a new pair made, then restart the key and join services): %w", ns, name, err)
		}
		return false, nil
	case !apierrors.IsNotFound(err):
		return false, fmt.Errorf("deploy: reading Secret %s/%s: %w", ns, name, err)
	}
	data, err := NewKeyServiceTLS(now)
	if err != nil {
		return false, fmt.Errorf("deploy: key service TLS: %w", err)
	}
	_, err = client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels(KeyService)},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}, metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) {
		// Another apply won the race; use its pair.
		return ensureKeyServiceTLS(ctx, client, now)
	}
	if err != nil {
		return false, fmt.Errorf("deploy: creating Secret %s/%s: %w", ns, name, err)
	}
	return true, nil
}

// CheckKeyServiceTLS checks the key service's TLS material: both pairs present and matching,
// issued by the CA for the right names and uses, valid at now.
func CheckKeyServiceTLS(data map[string][]byte, now time.Time) error {
	caPEM, ok := data[clusterrecord.KeyServiceCAKey]
	if !ok {
		return fmt.Errorf("no %s", clusterrecord.KeyServiceCAKey)
	}
	ca, err := pki.ParseCert(caPEM)
	if err != nil {
		return fmt.Errorf("%s: %w", clusterrecord.KeyServiceCAKey, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, pair := range []struct {
		certKey, keyKey string
		usage           x509.ExtKeyUsage
		name            string
	}{
		{clusterrecord.KeyServiceCertKey, clusterrecord.KeyServiceKeyKey, x509.ExtKeyUsageServerAuth, KeyServiceServerName},
		{clusterrecord.JoinServiceCertKey, clusterrecord.JoinServiceKeyKey, x509.ExtKeyUsageClientAuth, JoinServiceClientCN},
	} {
		kp, err := tls.X509KeyPair(data[pair.certKey], data[pair.keyKey])
		if err != nil {
			return fmt.Errorf("%s/%s: %w", pair.certKey, pair.keyKey, err)
		}
		leaf := kp.Leaf
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{pair.usage}}); err != nil {
			return fmt.Errorf("%s: %w", pair.certKey, err)
		}
		if pair.usage == x509.ExtKeyUsageServerAuth {
			if err := leaf.VerifyHostname(pair.name); err != nil {
				return fmt.Errorf("%s: %w", pair.certKey, err)
			}
		} else if leaf.Subject.CommonName != pair.name {
			return fmt.Errorf("%s: common name %q, want %q", pair.certKey, leaf.Subject.CommonName, pair.name)
		}
	}
	return nil
}
