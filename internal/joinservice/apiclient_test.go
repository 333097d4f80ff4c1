package joinservice_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/openconstellation/constellation/internal/joinservice"
)

// TestAPIClient checks what the service's client asks the API server for: protobuf, and no
// client-side rate limit (client-go's default would cap joins at 2.5/s), whatever the
// configuration it starts from says.
func TestAPIClient(t *testing.T) {
	var mu sync.Mutex
	var accept []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accept = append(accept, r.Header.Get("Accept"))
		mu.Unlock()
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)

	client, err := joinservice.APIClient(&rest.Config{Host: srv.URL, QPS: 5, Burst: 10})
	require.NoError(t, err)
	assert.Nil(t, client.CoreV1().RESTClient().GetRateLimiter(), "client-side rate limit")
	_, err = client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "x", metav1.GetOptions{})
	require.Error(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, accept)
	assert.Contains(t, accept[0], "application/vnd.kubernetes.protobuf")
}
