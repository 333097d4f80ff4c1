package joinclient_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// impostor is a join service an attacker controls in one way, and what the node logs when
// it refuses it.
type impostor struct {
	opts bootstraptest.ClusterOptions
	// wantReason is what the node logs for the refused service.
	wantReason string
}

// impostors are the join services a node must refuse, by name.
func impostors(t *testing.T) map[string]impostor {
	otherCA, err := akca.New("another platform's AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	otherImage := []softfirmware.Component{
		softfirmware.BytesComponent("bootstrapper", bootstraptest.PCRBootstrapper, []byte("bootstrapper with a backdoor")),
		bootstraptest.Image[1],
	}
	return map[string]impostor{
		"software AK showing the image's PCR values": {
			opts:       bootstraptest.ClusterOptions{SoftwareAK: true},
			wantReason: "no AK certificate, and AK roots are configured",
		},
		"real TPM whose AK the platform did not certify": {
			opts:       bootstraptest.ClusterOptions{Service: bootstraptest.NodeOptions{Uncertified: true}},
			wantReason: "no AK certificate, and AK roots are configured",
		},
		"real TPM certified by another CA": {
			opts:       bootstraptest.ClusterOptions{ServiceCA: otherCA},
			wantReason: "AK certificate: x509: certificate signed by unknown authority",
		},
		"genuine image, certified, not initialized": {
			opts:       bootstraptest.ClusterOptions{NoMarker: true},
			wantReason: "not initialized (PCR 15 is zero)",
		},
		"genuine worker serving a join service": {
			opts:       bootstraptest.ClusterOptions{Service: bootstraptest.NodeOptions{Role: metadata.Worker}},
			wantReason: "not as a control-plane",
		},
		"service whose node belongs to another cluster": {
			opts:       bootstraptest.ClusterOptions{WrongMarker: true},
			wantReason: "join service belongs to another cluster",
		},
		"service running another image": {
			opts:       bootstraptest.ClusterOptions{Service: bootstraptest.NodeOptions{Image: otherImage}},
			wantReason: "PCR 11: expected",
		},
	}
}

// Attacks on a booting node by the join service it talks to. The node is a real swtpm node
// as the local provider boots it (measured, AK certified, AK root in a platform NV index,
// platform hierarchy locked) and checks the service through joinservice.ServiceCheck built
// from its TPM, as nodeboot does; each impostor is a real join service (its own cluster, a
// real API server) on a node the attacker controls in one way. The node must refuse it
// before committing anything: PCR 15 stays zero, the storage keeps its fresh key and is not
// marked initialized, no PKI file is written, kubeadm does not run.
func TestJoinRefusesImpostorService(t *testing.T) {
	testCases := impostors(t)
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			if testing.Short() {
				t.Skip("starts swtpm, a join service and a kube-apiserver")
			}
			e := newEnv(t, metadata.Worker, tc.opts)
			e.refuses(t, e.client.Join, tc.wantReason)
			initialized, err := e.node.Storage.Initialized()
			require.NoError(t, err)
			assert.False(t, initialized, "storage marked initialized")
			for _, dir := range []string{e.pkiDir, e.kpkiDir} {
				_, err = os.Stat(dir)
				assert.ErrorIs(t, err, os.ErrNotExist, "PKI written")
			}
			assert.Empty(t, e.node.Node.LockHolder(), "node lock taken")
		})
	}
}

// A rebooted node is attacked the same way when it asks for its rejoin ticket: it must not
// extend PCR 15, unlock its storage or restart the kubelet for an impostor.
func TestRejoinRefusesImpostorService(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm, join services and a kube-apiserver")
	}
	all := impostors(t)
	testCases := map[string]impostor{}
	for _, name := range []string{"software AK showing the image's PCR values", "genuine worker serving a join service"} {
		testCases[name] = all[name]
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{})
			require.NoError(t, e.join())
			e.node.Reboot(t)
			impostor := bootstraptest.StartJoinService(t, e.ca, kube, tc.opts)
			impostor.Admit("node-1", e.meta.Instance.IPs[0], false)
			e.meta.SetJoinEndpoints([]string{impostor.Addr})
			e.newClient()
			e.refuses(t, e.client.Rejoin, tc.wantReason)
			assert.Equal(t, 0, e.kubelet.Restarts(), "kubelet restarted")
			assert.Empty(t, e.node.Node.LockHolder(), "node lock taken")
		})
	}
}

// The genuine service passes the same check: the attacks above fail for their reason, not
// because the node refuses everything.
func TestJoinAcceptsGenuineService(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm, a join service and a kube-apiserver")
	}
	e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{})
	require.NoError(t, e.join())
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(e.cluster.ClusterID), e.node.ClusterIDRegister(t))
	assert.Equal(t, []string{"join"}, e.kubeadm.CallList())
}

// refuses runs call (Join or Rejoin) until the node has logged the refusal of the service
// for wantReason, stops it, and checks that the node committed nothing to the service.
func (e *env) refuses(t *testing.T, call func(context.Context) error, wantReason string) {
	t.Helper()
	e.logs.Reset() // only what this call logs
	kubeadmCalls := e.kubeadm.CallList()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	if !assert.Eventually(t, func() bool { return strings.Contains(e.logs.String(), wantReason) }, time.Minute, 20*time.Millisecond,
		"the node never logged %q", wantReason) {
		t.Logf("node log:\n%s", e.logs.String())
	}
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(time.Minute):
		t.Fatal("the join client did not stop after its context ended")
	}
	assert.Equal(t, make([]byte, 32), e.node.ClusterIDRegister(t), "PCR 15 extended")
	assert.Equal(t, kubeadmCalls, e.kubeadm.CallList(), "kubeadm ran")
	assert.NotContains(t, e.logs.String(), "node lock taken", "the node committed")
}
