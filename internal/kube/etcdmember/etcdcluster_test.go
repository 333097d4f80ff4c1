package etcdmember_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/kube/etcdmember"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/pki"
)

// etcdCluster is a real etcd cluster on loopback, built like kubeadm's stacked etcd as far as
// etcdctl sees it: clients connect over TLS with client certificate authentication, and the
// certificates lie in kubeadm's layout (pki/etcd/ca.crt, healthcheck-client.{crt,key}). Peers
// talk plain HTTP: etcdctl never sees that side.
type etcdCluster struct {
	t       *testing.T
	etcd    string
	etcdctl string
	dir     string
	// pkiDir plays the node's /etc/kubernetes/pki/etcd.
	pkiDir  string
	members []*etcdProcess
}

type etcdProcess struct {
	name, clientURL, peerURL, dataDir string
	cmd                               *exec.Cmd
	exited                            chan struct{}
}

func needBinaries(t *testing.T) (etcd, etcdctl string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real etcd processes")
	}
	etcd, err := kubetest.Binary("etcd")
	require.NoError(t, err)
	etcdctl, err = kubetest.Binary("etcdctl")
	require.NoError(t, err)
	return etcd, etcdctl
}

// startEtcdCluster starts n members m0..m(n-1) and waits until every one is healthy.
func startEtcdCluster(t *testing.T, n int) *etcdCluster {
	t.Helper()
	etcd, etcdctl := needBinaries(t)
	dir := t.TempDir()
	c := &etcdCluster{t: t, etcd: etcd, etcdctl: etcdctl, dir: dir, pkiDir: filepath.Join(dir, "pki", "etcd")}

	now := time.Now()
	ca, err := pki.NewCA("etcd-ca", now, time.Hour)
	require.NoError(t, err)
	require.NoError(t, pki.WriteFile(c.pkiDir, "ca.crt", pki.EncodeCert(ca.Cert)))
	client, clientKey, err := ca.NewLeaf(pki.Leaf{CommonName: "kube-etcd-healthcheck-client", Client: true, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)})
	require.NoError(t, err)
	require.NoError(t, pki.WriteCertAndKey(c.pkiDir, "healthcheck-client", client, clientKey))
	server, serverKey, err := ca.NewLeaf(pki.Leaf{CommonName: "etcd", Server: true, Client: true, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)})
	require.NoError(t, err)
	require.NoError(t, pki.WriteCertAndKey(c.pkiDir, "server", server, serverKey))

	ports := freePorts(t, 2*n)
	initial := ""
	for i := range n {
		m := &etcdProcess{
			name:      fmt.Sprintf("m%d", i),
			clientURL: "https://127.0.0.1:" + strconv.Itoa(ports[2*i]),
			peerURL:   "http://127.0.0.1:" + strconv.Itoa(ports[2*i+1]),
			dataDir:   filepath.Join(dir, fmt.Sprintf("m%d", i)),
		}
		if i > 0 {
			initial += ","
		}
		initial += m.name + "=" + m.peerURL
		c.members = append(c.members, m)
	}
	t.Cleanup(c.stopAll)
	for i := range c.members {
		c.start(i, initial)
	}
	c.waitHealthy(0)
	return c
}

func (c *etcdCluster) start(i int, initial string) {
	c.t.Helper()
	m := c.members[i]
	args := []string{
		"--name=" + m.name, "--data-dir=" + m.dataDir,
		"--listen-client-urls=" + m.clientURL, "--advertise-client-urls=" + m.clientURL,
		"--listen-peer-urls=" + m.peerURL, "--initial-advertise-peer-urls=" + m.peerURL,
		"--initial-cluster=" + initial, "--initial-cluster-token=etcdmember-test",
		"--cert-file=" + filepath.Join(c.pkiDir, "server.crt"), "--key-file=" + filepath.Join(c.pkiDir, "server.key"),
		"--trusted-ca-file=" + filepath.Join(c.pkiDir, "ca.crt"), "--client-cert-auth=true",
		"--log-level=warn", "--unsafe-no-fsync",
	}
	log, err := os.OpenFile(filepath.Join(c.dir, m.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	require.NoError(c.t, err)
	defer log.Close()
	m.cmd = exec.Command(c.etcd, args...)
	m.cmd.Stdout, m.cmd.Stderr = log, log
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(c.t, m.cmd.Start())
	m.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(m.cmd, m.exited)
}

// kill ends member i at once, as a crash would.
func (c *etcdCluster) kill(i int) {
	m := c.members[i]
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	<-m.exited
	m.cmd = nil
}

// restart starts a killed member again on its data.
func (c *etcdCluster) restart(i int) {
	c.t.Helper()
	initial := ""
	for j, m := range c.members {
		if j > 0 {
			initial += ","
		}
		initial += m.name + "=" + m.peerURL
	}
	c.start(i, initial)
}

func (c *etcdCluster) stopAll() {
	for i := range c.members {
		c.kill(i)
	}
}

// runner returns etcdctl on this machine talking to member i, with the flags kubeadm's pod
// gives it but the files of this cluster.
func (c *etcdCluster) runner(i int) *hostRunner {
	return &hostRunner{bin: c.etcdctl, flags: []string{
		"--cacert=" + filepath.Join(c.pkiDir, "ca.crt"),
		"--cert=" + filepath.Join(c.pkiDir, "healthcheck-client.crt"),
		"--key=" + filepath.Join(c.pkiDir, "healthcheck-client.key"),
		"--endpoints=" + c.members[i].clientURL,
	}}
}

// waitHealthy waits until etcdctl through member i sees every listed member healthy.
func (c *etcdCluster) waitHealthy(i int) {
	c.t.Helper()
	client := etcdmember.New(c.runner(i), time.Second)
	var last []etcdmember.Member
	var lastErr error
	require.Eventually(c.t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		last, lastErr = client.Members(ctx)
		if lastErr != nil {
			return false
		}
		for _, m := range last {
			if !m.Healthy {
				return false
			}
		}
		return true
	}, 60*time.Second, 100*time.Millisecond, "etcd cluster not healthy: %v %v", last, lastErr)
}

// hostRunner runs etcdctl on this machine: the seam where production runs it in a pod.
type hostRunner struct {
	bin   string
	flags []string
}

func (r *hostRunner) Run(ctx context.Context, args ...string) ([]byte, []byte, error) {
	return runEtcdctl(ctx, r.bin, append(append([]string{}, r.flags...), args...))
}

func runEtcdctl(ctx context.Context, bin string, args []string) ([]byte, []byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.Exited() {
		err = etcdmember.NewExitError(exit.ExitCode(), stderr.Bytes())
	}
	return stdout.Bytes(), stderr.Bytes(), err
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
