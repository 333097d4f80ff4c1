package apilb_test

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/provider/local/apilb"
)

// A real kube-apiserver behind the balancer, next to a backend nothing listens on: its
// anonymous /readyz makes it healthy, client-go reaches it through the balancer and verifies
// its certificate end to end (the balancer's address, 127.0.0.1, is in its SANs, as the
// local provider's address is in a cluster's), and once it is gone the balancer takes it out.
func TestRealAPIServerBehindTheBalancer(t *testing.T) {
	kube := kubetest.Start(t, kubetest.Options{})
	apiURL, err := url.Parse(kube.AdminConfig.Host)
	require.NoError(t, err)
	b, lbAddr := startBalancer(t)
	b.Update([]apilb.Backend{{Addr: deadAddr(t)}, {Addr: apiURL.Host}})
	waitHealthy(t, b, 1)
	assert.Equal(t, []string{apiURL.Host}, b.Healthy())

	cfg := rest.CopyConfig(kube.AdminConfig)
	cfg.Host = "https://" + lbAddr
	cfg.Timeout = 10 * time.Second
	require.NotEmpty(t, cfg.TLSClientConfig.CAData, "the client verifies the API server's certificate")
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	for range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		cancel()
		require.NoError(t, err)
	}

	// A server of another name behind the balancer is refused by the client's TLS: the
	// balancer's health check proved nothing about it.
	other := newFakeAPIServer(t, "impostor", true)
	b.Update([]apilb.Backend{{Addr: other.addr()}})
	waitHealthy(t, b, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "certificate")

	b.Update([]apilb.Backend{{Addr: apiURL.Host}})
	waitHealthy(t, b, 1)
	kube.Stop()
	require.Eventually(t, func() bool { return len(b.Healthy()) == 0 }, 10*time.Second, 10*time.Millisecond,
		"the stopped API server is out: %+v", b.Status())
	_, err = net.DialTimeout("tcp", lbAddr, time.Second)
	require.NoError(t, err, "the balancer still accepts (and closes) connections")
}
