package nodeimage

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/testnet"
)

// corefile is kubeadm v1.34's default Corefile (cluster.local), with the listen addresses moved
// to free ports (the server port on every address: "bind" is not among kubeadm's plugins, so
// our build lacks it) and the kubernetes plugin reading a kubeconfig instead of the
// in-cluster service account.
const corefile = `.:%[1]d {
    errors
    health 127.0.0.1:%[2]d {
       lameduck 5s
    }
    ready 127.0.0.1:%[3]d
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       kubeconfig %[5]s
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus 127.0.0.1:%[4]d
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
`

// TestCoreDNSServesKubernetes runs the CoreDNS that `make images` built (tools/coredns, our
// plugin list) with kubeadm's Corefile against a real API server, and resolves the cluster's
// kubernetes Service through it.
func TestCoreDNSServesKubernetes(t *testing.T) {
	r, err := kubeversion.Lookup(kubetest.Version)
	require.NoError(t, err)
	bin := filepath.Join(imagesDir(t), "bin", "coredns-"+r.CoreDNS)
	require.FileExists(t, bin, "CoreDNS of the default Kubernetes version is built by make images")
	cluster := kubetest.Start(t, kubetest.Options{})

	ports, err := testnet.Ports(4)
	require.NoError(t, err)
	dns, health, ready, metrics := ports[0], ports[1], ports[2], ports[3]
	conf := fmt.Sprintf(corefile, dns, health, ready, metrics, cluster.Kubeconfig)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "Corefile"), []byte(conf), 0o644))
	log, err := os.Create(filepath.Join(dir, "coredns.log"))
	require.NoError(t, err)
	cmd := exec.Command(bin, "-conf", filepath.Join(dir, "Corefile"))
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		log.Close()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("coredns log:\n%s", out)
		}
	})

	// Ready once the kubernetes plugin has synced with the API server.
	require.Eventually(t, func() bool {
		select {
		case err := <-exited:
			exited <- err
			require.FailNow(t, "coredns exited", "%v", err)
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", ready))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "coredns did not become ready")

	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", dns))
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// /ready can answer before the DNS server listens (plugins register with it as they start).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		addrs, err := resolver.LookupHost(ctx, "kubernetes.default.svc.cluster.local")
		require.NoError(c, err)
		assert.Equal(c, []string{"10.96.0.1"}, addrs, "the first address of the service CIDR")
	}, 30*time.Second, 100*time.Millisecond)

	_, err = resolver.LookupHost(ctx, "missing.default.svc.cluster.local")
	var dnsErr *net.DNSError
	require.ErrorAs(t, err, &dnsErr)
	assert.True(t, dnsErr.IsNotFound, "no such service: %v", err)

	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", health))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}
