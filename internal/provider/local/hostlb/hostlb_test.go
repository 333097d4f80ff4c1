package hostlb

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/openconstellation/constellation/internal/testnet"
)

// cluster is two nodes of which only the second answers on the node ports, behind a dialer
// that reaches a local HTTP server for them.
type cluster struct {
	backend *httptest.Server
	nodes   []netip.Addr
}

func newCluster(t *testing.T) *cluster {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "pod answered") }))
	t.Cleanup(srv.Close)
	return &cluster{backend: srv, nodes: []netip.Addr{netip.MustParseAddr("10.42.0.10"), netip.MustParseAddr("10.42.0.11")}}
}

func (c *cluster) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ap := netip.MustParseAddrPort(addr)
	if ap.Addr() != c.nodes[1] {
		return nil, fmt.Errorf("dial %s: connection refused", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, c.backend.Listener.Addr().String())
}

func get(t *testing.T, addr string) string {
	t.Helper()
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + addr + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// TestBalancer: a NodePort Service is reachable at 127.0.0.1:<nodePort>, a LoadBalancer
// Service at an address of the pool (written to its status) and its ports; both reach a
// node that answers when another does not; a deleted Service's ports close.
func TestBalancer(t *testing.T) {
	c := newCluster(t)
	ports, err := testnet.Ports(3)
	require.NoError(t, err)
	nodePortA, nodePortB, lbPort := int32(ports[0]), int32(ports[1]), int32(ports[2])
	client := fake.NewClientset(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80, NodePort: nodePortA}},
		}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "apps"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: lbPort, NodePort: nodePortB}},
		}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "internal", Namespace: "default"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80}},
		}},
	)
	b := New(Config{Client: client, Dial: c.dial, Nodes: func() []netip.Addr { return c.nodes }, Pool: netip.MustParseAddr("127.0.43.1")})
	t.Cleanup(b.closeAll)
	ctx := context.Background()
	require.NoError(t, b.Reconcile(ctx))

	assert.Equal(t, "pod answered", get(t, fmt.Sprintf("127.0.0.1:%d", nodePortA)), "NodePort on the host's loopback")
	shop, err := client.CoreV1().Services("apps").Get(ctx, "shop", metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, shop.Status.LoadBalancer.Ingress, 1)
	ip := shop.Status.LoadBalancer.Ingress[0].IP
	assert.Equal(t, "127.0.43.1", ip)
	assert.Equal(t, "pod answered", get(t, net.JoinHostPort(ip, fmt.Sprint(lbPort))), "LoadBalancer at its address")
	assert.Equal(t, "pod answered", get(t, fmt.Sprintf("127.0.0.1:%d", nodePortB)), "and its NodePort")

	// Again: nothing changes, the address is kept.
	require.NoError(t, b.Reconcile(ctx))
	assert.Len(t, b.Forwarded(), 3)
	shop, err = client.CoreV1().Services("apps").Get(ctx, "shop", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, ip, shop.Status.LoadBalancer.Ingress[0].IP)

	require.NoError(t, client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}))
	require.NoError(t, b.Reconcile(ctx))
	_, err = net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", nodePortA), time.Second)
	assert.Error(t, err, "the deleted Service's port is closed")
	assert.Len(t, b.Forwarded(), 2)
}

// TestBalancerNoNodeAnswers: a connection no node accepts is closed, not hung.
func TestBalancerNoNodeAnswers(t *testing.T) {
	c := newCluster(t)
	port := int32(testnet.Port(t))
	client := fake.NewClientset(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80, NodePort: port}},
	}})
	b := New(Config{Client: client, Dial: c.dial, Nodes: func() []netip.Addr { return c.nodes[:1] }})
	t.Cleanup(b.closeAll)
	require.NoError(t, b.Reconcile(context.Background()))
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = conn.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
}

// TestBalancerNewClientKeepsPorts: a new credential (SetClient, as the provider does when
// apply writes a new token) keeps every port open and every address, and a credential the API
// refuses closes nothing either: a client of the Services never sees a refused connection
// because of it.
func TestBalancerNewClientKeepsPorts(t *testing.T) {
	c := newCluster(t)
	ports, err := testnet.Ports(2)
	require.NoError(t, err)
	nodePort, lbPort := int32(ports[0]), int32(ports[1])
	shop := func() *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "apps"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: lbPort, NodePort: nodePort}},
		}}
	}
	first := fake.NewClientset(shop())
	b := New(Config{Client: first, Dial: c.dial, Nodes: func() []netip.Addr { return c.nodes }, Pool: netip.MustParseAddr("127.0.44.1")})
	t.Cleanup(b.closeAll)
	ctx := context.Background()
	require.NoError(t, b.Reconcile(ctx))
	listeners := func() map[netip.AddrPort]net.Listener {
		b.mu.Lock()
		defer b.mu.Unlock()
		m := map[netip.AddrPort]net.Listener{}
		for a, f := range b.listeners {
			m[a] = f.ln
		}
		return m
	}
	before := listeners()
	require.Len(t, before, 2)

	// The same cluster seen with a new token: the Service carries the address the balancer wrote.
	second := fake.NewClientset()
	written, err := first.CoreV1().Services("apps").Get(ctx, "shop", metav1.GetOptions{})
	require.NoError(t, err)
	_, err = second.CoreV1().Services("apps").Create(ctx, written, metav1.CreateOptions{})
	require.NoError(t, err)
	b.SetClient(second)
	require.NoError(t, b.Reconcile(ctx))
	assert.Equal(t, before, listeners(), "the same listeners, never closed")
	assert.Equal(t, "pod answered", get(t, net.JoinHostPort("127.0.44.1", fmt.Sprint(lbPort))))

	// A token the API refuses: the reconciliation fails, the ports stay.
	refused := fake.NewClientset()
	refused.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewUnauthorized("token expired")
	})
	b.SetClient(refused)
	require.Error(t, b.Reconcile(ctx))
	assert.Equal(t, before, listeners())
	assert.Equal(t, "pod answered", get(t, fmt.Sprintf("127.0.0.1:%d", nodePort)))
}
