package kubeadm_test

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/kube/kubeadm"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubeletcred"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/testtier"
)

// runner runs the real kubeadm in dry-run mode, with its dry-run directory (where it
// writes certificates, kubeconfigs and manifests instead of /etc/kubernetes) in a temporary
// directory, so the host is not touched.
func runner(t *testing.T) (kubeadm.Runner, string) {
	testtier.Integration(t, "kubeadm (make kube)")
	bin, err := kubetest.Binary("kubeadm")
	require.NoError(t, err)
	dir := t.TempDir()
	return kubeadm.Runner{Binary: bin, DryRun: true, Env: []string{"KUBEADM_INIT_DRYRUN_DIR=" + dir}}, dir
}

func initConfig(t *testing.T) []byte {
	cfg, err := kubeadmconfig.Init(kubeadmconfig.InitParams{
		NodeName: "control-plane-0", NodeIP: netip.MustParseAddr("10.42.0.2"), ClusterName: "demo",
		KubernetesVersion: kubetest.Version, ServiceCIDR: netip.MustParsePrefix("10.96.0.0/12"),
		CRISocket: "unix:///run/containerd/containerd.sock", Sandbox: true, KubeletServingCert: true,
	})
	require.NoError(t, err)
	return cfg
}

// The real kubeadm runs init with the generated configuration, uses the cluster CAs the
// init server created beforehand, and would start a control plane with our settings.
func TestInitDryRun(t *testing.T) {
	r, dir := runner(t)
	cluster, err := pki.NewCluster(time.Now())
	require.NoError(t, err)
	require.NoError(t, cluster.Write(dir))
	// The kubelet's kubeconfig with its short-lived client certificate, as the init server
	// writes it (in a dry run kubeadm's kubeconfig directory is the dry-run directory).
	certPEM, keyPEM, err := kubeletcred.Issue(cluster.CA, "control-plane-0", time.Now())
	require.NoError(t, err)
	kubeletConf, err := kubeletcred.Kubeconfig(kubeletcred.KubeconfigParams{
		ClusterName: "demo", Server: "10.42.0.2:6443", NodeName: "control-plane-0",
		CACert: pki.EncodeCert(cluster.CA.Cert), ClientCert: certPEM, ClientKey: keyPEM,
	})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kubelet.conf"), kubeletConf, 0o600))

	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, r.Init(ctx, initConfig(t), &out))
	log := out.String()
	for _, want := range []string{
		`[certs] Using the existing "ca" certificate and key`,
		`[certs] Using the existing "etcd/ca" certificate and key`,
		`[certs] Using the existing "sa" key`,
		"--advertise-address=10.42.0.2",
		"--profiling=false",
		"--kubelet-certificate-authority=",
		"--bind-address=127.0.0.1",
		"--cluster-signing-duration=24h0m0s",
		"--authorization-config=/etc/kubernetes/constellation/authorization.yaml",
		"mountPath: /etc/kubernetes/constellation",
		`[kubeconfig] Using existing kubeconfig file: "` + filepath.Join(dir, "kubelet.conf") + `"`,
	} {
		assert.True(t, strings.Contains(log, want), "kubeadm output lacks %q", want)
	}
	// No bootstrap token, and none of the rules that let one ask for any node's certificate.
	for _, unwanted := range []string{"[bootstrap-token]", "node-autoapprove-bootstrap", "kubeadm join", "--authorization-mode"} {
		assert.False(t, strings.Contains(log, unwanted), "kubeadm output has %q", unwanted)
	}
	// kubeadm kept the kubelet's kubeconfig as the init server wrote it.
	kept, err := os.ReadFile(filepath.Join(dir, "kubelet.conf"))
	require.NoError(t, err)
	assert.Equal(t, kubeletConf, kept)

	// The CA kubeadm used is ours, unchanged.
	caPEM, err := os.ReadFile(filepath.Join(dir, pki.CACert))
	require.NoError(t, err)
	assert.Equal(t, pki.EncodeCert(cluster.CA.Cert), caPEM)
	// The kubelet configuration it writes serves the certificate the bootstrapper provides.
	kubelet, err := os.ReadFile(filepath.Join(dir, "config.yaml"))
	require.NoError(t, err)
	assert.Contains(t, string(kubelet), "tlsCertFile: "+kubeadmconfig.KubeletCertFile)
	assert.Contains(t, string(kubelet), "cgroupDriver: cgroupfs")
}

// A failing kubeadm: the error carries the exit code and the end of its output; the whole
// output went to the writer.
func TestInitFails(t *testing.T) {
	r, _ := runner(t)
	var out bytes.Buffer
	bad := bytes.Replace(initConfig(t), []byte("kubernetesVersion: "+kubetest.Version), []byte("kubernetesVersion: not-a-version"), 1)
	err := r.Init(context.Background(), bad, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "kubeadm init failed with exit code 1")
	assert.Contains(t, err.Error(), "not-a-version")
	assert.Contains(t, out.String(), "not-a-version")
}

func TestMissingBinary(t *testing.T) {
	r := kubeadm.Runner{Binary: filepath.Join(t.TempDir(), "kubeadm")}
	err := r.Join(context.Background(), []byte("x"), nil)
	assert.ErrorContains(t, err, "kubeadm join")
	assert.ErrorContains(t, err, "no such file")
}

// The upgrade commands: kubeadm's subcommand words, the configuration, and apply's --yes
// (without it kubeadm asks on the terminal and fails without one).
func TestUpgradeCommands(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "kubeadm")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\necho \"$@\"\n"), 0o755))
	r := kubeadm.Runner{Binary: bin}
	for name, tc := range map[string]struct {
		run  func(context.Context, []byte, io.Writer) error
		want string
	}{
		"apply":  {run: r.UpgradeApply, want: `^upgrade apply --config \S+/kubeadm.yaml --yes\n$`},
		"addons": {run: r.UpgradeAddons, want: `^upgrade node phase addon all --config \S+/kubeadm.yaml\n$`},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			require.NoError(t, tc.run(context.Background(), []byte("x"), &out))
			assert.Regexp(t, tc.want, out.String())
		})
	}
}
