// Package bootstraptoken creates kubeadm bootstrap tokens: real bootstrap.kubernetes.io/token
// Secrets in kube-system that the API server's bootstrap-token authenticator accepts as
// system:bootstrap:<id> until they expire.
package bootstraptoken

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
)

// DefaultTTL is how long a join token is valid unless configured otherwise: long enough for a
// slow `kubeadm join`, short enough that a leaked token is soon worthless.
const DefaultTTL = 15 * time.Minute

// NodeGroup is the extra group kubeadm gives node bootstrap tokens; kubeadm's RBAC rules let
// this group create CSRs and read the cluster-info it needs to join.
const NodeGroup = "system:bootstrappers:kubeadm:default-node-token"

// Token is a created bootstrap token.
type Token struct {
	ID, Secret string
	Expiration time.Time
}

// String returns the token as kubeadm expects it: "<id>.<secret>".
func (t Token) String() string { return bootstraputil.TokenFromIDAndSecret(t.ID, t.Secret) }

// SecretName returns the name of the token's Secret in kube-system.
func (t Token) SecretName() string { return bootstraputil.BootstrapTokenSecretName(t.ID) }

// Create creates a random token valid for ttl from now, for authentication and signing (as
// kubeadm's default tokens), in NodeGroup. An id collision with an existing token is retried
// with a new token; every other API error is returned.
func Create(ctx context.Context, client kubernetes.Interface, ttl time.Duration, now time.Time, description string) (Token, error) {
	if ttl <= 0 {
		return Token{}, fmt.Errorf("bootstrap token TTL must be positive, got %s", ttl)
	}
	for range 3 {
		raw, err := bootstraputil.GenerateBootstrapToken()
		if err != nil {
			return Token{}, fmt.Errorf("generating bootstrap token: %w", err)
		}
		id, secret, _ := strings.Cut(raw, ".")
		tok := Token{ID: id, Secret: secret, Expiration: now.Add(ttl).UTC().Truncate(time.Second)}
		_, err = client.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, tok.secret(description), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return Token{}, fmt.Errorf("creating bootstrap token secret: %w", err)
		}
		return tok, nil
	}
	return Token{}, errors.New("creating bootstrap token: three id collisions in a row")
}

// Delete removes the token's Secret, so the token stops authenticating at once.
func Delete(ctx context.Context, client kubernetes.Interface, id string) error {
	err := client.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, bootstraputil.BootstrapTokenSecretName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting bootstrap token %s: %w", id, err)
	}
	return nil
}

func (t Token) secret(description string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: t.SecretName(), Namespace: metav1.NamespaceSystem},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		StringData: map[string]string{
			bootstrapapi.BootstrapTokenIDKey:               t.ID,
			bootstrapapi.BootstrapTokenSecretKey:           t.Secret,
			bootstrapapi.BootstrapTokenExpirationKey:       t.Expiration.Format(time.RFC3339),
			bootstrapapi.BootstrapTokenUsageAuthentication: "true",
			bootstrapapi.BootstrapTokenUsageSigningKey:     "true",
			bootstrapapi.BootstrapTokenExtraGroupsKey:      NodeGroup,
			bootstrapapi.BootstrapTokenDescriptionKey:      description,
		},
	}
}
