package bootstraptoken_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/openconstellation/constellation/internal/kube/bootstraptoken"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
)

func TestCreateAuthenticateDelete(t *testing.T) {
	kube := kubetest.Start(t, kubetest.Options{})
	ctx := context.Background()
	now := time.Now()

	tok, err := bootstraptoken.Create(ctx, kube.Admin, time.Hour, now, "test token")
	require.NoError(t, err)
	assert.Regexp(t, `^[a-z0-9]{6}\.[a-z0-9]{16}$`, tok.String())
	assert.Equal(t, now.Add(time.Hour).UTC().Truncate(time.Second), tok.Expiration)

	secret, err := kube.Admin.CoreV1().Secrets("kube-system").Get(ctx, tok.SecretName(), metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "bootstrap.kubernetes.io/token", string(secret.Type))
	assert.Equal(t, tok.Expiration.Format(time.RFC3339), string(secret.Data["expiration"]))

	client, err := kube.ClientFor(rest.Config{BearerToken: tok.String()})
	require.NoError(t, err)
	var review *authv1.SelfSubjectReview
	// The API server's token authenticator reads Secrets through an informer: a new token
	// is usable once the informer has seen it (a fraction of a second).
	require.Eventually(t, func() bool {
		review, err = client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "token never authenticated: %v", err)
	assert.Equal(t, "system:bootstrap:"+tok.ID, review.Status.UserInfo.Username)
	assert.Contains(t, review.Status.UserInfo.Groups, bootstraptoken.NodeGroup)

	require.NoError(t, bootstraptoken.Delete(ctx, kube.Admin, tok.ID))
	_, err = kube.Admin.CoreV1().Secrets("kube-system").Get(ctx, tok.SecretName(), metav1.GetOptions{})
	require.Error(t, err)
	require.NoError(t, bootstraptoken.Delete(ctx, kube.Admin, tok.ID), "deleting twice is fine")

	_, err = bootstraptoken.Create(ctx, kube.Admin, 0, now, "")
	assert.ErrorContains(t, err, "TTL must be positive")
}
