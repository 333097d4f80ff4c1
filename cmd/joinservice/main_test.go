package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kms/keyservice"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/testnet"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var image = []softfirmware.Component{
	softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("bootstrapper v1")),
	softfirmware.BytesComponent("node config", local.PCRNodeConfig, []byte("node config v1")),
}

// node boots a swtpm from image and certifies its AKs; marker, if set, is extended into PCR
// 15. It returns the swtpm's address (released: used per use) and the file of the boot's
// event log, as the local provider writes it.
func node(t *testing.T, ca *akca.CA, name string, role metadata.Role, marker []byte) (string, string) {
	t.Helper()
	proc := vtpmtest.SwtpmProcess(t)
	tpm, err := proc.Open(context.Background())
	require.NoError(t, err)
	defer tpm.Close()
	bootLog, err := softfirmware.MeasureLogged(tpm, image)
	require.NoError(t, err)
	logPath := filepath.Join(t.TempDir(), local.EventLogFile)
	require.NoError(t, local.WriteEventLog(logPath, bootLog))
	require.NoError(t, softfirmware.CertifyAK(tpm, ca, name, role, time.Now()))
	require.NoError(t, softfirmware.LockPlatform(tpm))
	if marker != nil {
		d := sha256.Sum256(marker)
		require.NoError(t, tpm.ExtendPCR(int(markerRegister), d[:]))
	}
	return proc.Addr(), logPath
}

// The join service as its DaemonSet runs it: configuration from mounted files, its node's
// TPM per use, the key service over mutual TLS, nodes named by the metadata service. A
// rebooted node gets its rejoin ticket through the mutually attested channel; once the
// mounted reference sets retire its image, it no longer does.
func TestRun(t *testing.T) {
	ctx := context.Background()
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	master, err := kms.NewMasterSecret()
	require.NoError(t, err)
	salt := bytes.Repeat([]byte{0x42}, 32)
	ms, err := master.MeasurementSecret()
	require.NoError(t, err)
	clusterID, err := kms.ClusterID(ms, salt)
	require.NoError(t, err)

	serviceTPM, serviceLog := node(t, ca, "control-plane-0", metadata.ControlPlane, clusterID)
	workerTPM, workerLog := node(t, ca, "worker-0", metadata.Worker, nil)

	// What the DaemonSet mounts.
	dir := t.TempDir()
	configDir, tlsDir, pkiDir := filepath.Join(dir, "config"), filepath.Join(dir, "tls"), filepath.Join(dir, "pki")
	for _, d := range []string{configDir, tlsDir} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	record, err := json.Marshal(clusterrecord.Cluster{
		Name: "demo", ClusterID: hex.EncodeToString(clusterID), MeasurementSalt: base64.StdEncoding.EncodeToString(salt),
		KubernetesVersion: "v1.34.4", ClusterIDMarker: hex.EncodeToString(variant.QEMUVTPM.ClusterIDMarker(clusterID)),
	})
	require.NoError(t, err)
	att, err := clusterrecord.AttestationData(choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{
		Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: softfirmware.ExpectedPCRs(image)}},
		AKRoots:      string(pki.EncodeCert(ca.Certificate())),
	}})
	require.NoError(t, err)
	writeFile(t, configDir, clusterrecord.ClusterKey, record)
	for k, v := range att {
		writeFile(t, configDir, k, []byte(v))
	}
	tlsData, err := deploy.NewKeyServiceTLS(time.Now())
	require.NoError(t, err)
	for k, v := range tlsData {
		writeFile(t, tlsDir, k, v)
	}
	cluster, err := pki.NewCluster(time.Now())
	require.NoError(t, err)
	require.NoError(t, cluster.Write(pkiDir))
	// The API server holds the disk-owner records: worker-0's disk was recorded when it
	// joined (the join ticket's record, written here directly).
	kube := kubetest.Start(t, kubetest.Options{})
	kubeconfig := kube.Kubeconfig
	uuid := "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	require.NoError(t, diskowner.EnsureNamespace(ctx, kube.Admin))
	_, err = diskowner.Store{Client: kube.Admin}.Claim(ctx, uuid, "worker-0")
	require.NoError(t, err)

	keyServiceAddr := startKeyService(t, master, tlsData)
	metadataURL := startMetadata(t, `[{"name":"control-plane-0","role":"control-plane","ips":["10.42.0.10"]},{"name":"worker-0","role":"worker","ips":["10.42.0.11"]}]`)

	addr := testnet.Addr(t)
	var logs cmdutil.SyncBuffer
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	args := []string{
		"--listen=" + addr, "--config-dir=" + configDir, "--pki-dir=" + pkiDir, "--tpm=" + serviceTPM, "--event-log=" + serviceLog,
		"--metadata-url=" + metadataURL, "--key-service=" + keyServiceAddr, "--key-service-tls-dir=" + tlsDir,
		"--kubeconfig=" + kubeconfig, "--log-level=debug",
	}
	env := map[string]string{"CONSTELLATION_API_SERVER_ENDPOINT": "10.42.0.10:6443"}
	go func() { done <- run(runCtx, args, func(k string) string { return env[k] }, &logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Error("run did not return after the context ended")
		}
	})

	// The worker: attests with its own TPM, verifies the service against its own image
	// registers and the AK root in its TPM (joinservice.ServiceCheck), as the join client does.
	workerRW, err := vtpm.Open(ctx, workerTPM)
	require.NoError(t, err)
	t.Cleanup(func() { workerRW.Close() })
	issuer, err := qemu.NewIssuer(workerRW, nil, vtpm.ReadEventLog(workerLog))
	require.NoError(t, err)
	serviceValidator, err := joinservice.ServiceCheck{Variant: variant.QEMUVTPM}.Validator(workerRW)
	require.NoError(t, err)
	dial, err := joinclient.AttestedDialer(issuer, serviceValidator)
	require.NoError(t, err)
	conn, err := dial(ctx, addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	client := joinpb.NewJoinServiceClient(conn)

	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	clientCSR, err := kubeletcsr.ClientRequest("worker-0", clientKey)
	require.NoError(t, err)
	var ticket *joinpb.IssueRejoinTicketResponse
	var rejoinErr error
	require.Eventually(t, func() bool {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		ticket, rejoinErr = client.IssueRejoinTicket(cctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid, ClientCertificateRequest: clientCSR})
		return rejoinErr == nil
	}, 20*time.Second, 100*time.Millisecond, "rejoin never succeeded")
	cert, err := pki.ParseCert(ticket.KubeletClientCert)
	require.NoError(t, err)
	assert.Equal(t, "system:node:worker-0", cert.Subject.CommonName, "the binary signs the node's own client certificate")
	wantDisk, err := master.StateDiskKey(uuid)
	require.NoError(t, err)
	assert.Equal(t, wantDisk, ticket.StateDiskKey)
	assert.Equal(t, ms, ticket.MeasurementSecret)
	assert.Equal(t, salt, ticket.MeasurementSalt)
	assert.Contains(t, logs.String(), `"msg":"admission accepted"`)
	assert.Contains(t, logs.String(), `"node":"worker-0"`)

	// An upgrade that retired image-v1: the mounted file changes, the service reloads it, and
	// the worker is refused.
	retired, err := json.Marshal(measurements.ReferenceSets{{Name: "image-v2", Measurements: softfirmware.ExpectedPCRs([]softfirmware.Component{
		softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("bootstrapper v2")),
	})}})
	require.NoError(t, err)
	writeFile(t, configDir, clusterrecord.ReferenceSetsKey, retired)
	var refused error
	require.Eventually(t, func() bool {
		conn, err := dial(ctx, addr)
		if err != nil {
			return false
		}
		defer conn.Close()
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		// Until the service reloaded the file, the request passes admission and is refused
		// for what it lacks (a kubelet certificate request): wait for the admission refusal.
		_, refused = joinpb.NewJoinServiceClient(conn).IssueRejoinTicket(cctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid})
		return refused != nil && strings.Contains(refused.Error(), "measurements do not match")
	}, 60*time.Second, 200*time.Millisecond)
	assert.ErrorContains(t, refused, "measurements do not match any reference set")
	assert.ErrorContains(t, refused, "image-v2")
	assert.Contains(t, logs.String(), `"msg":"reference sets reloaded"`)
}

func TestRunRefuses(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, clusterrecord.ClusterKey, []byte(`{"name":"demo"}`))
	for _, k := range []string{clusterrecord.VariantKey, clusterrecord.ReferenceSetsKey, clusterrecord.AKRootsKey} {
		writeFile(t, dir, k, []byte("x"))
	}
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no API server endpoint":   {args: []string{"--config-dir=" + dir}, want: "--api-server-endpoint is required"},
		"no configuration":         {args: []string{"--api-server-endpoint=10.42.0.10:6443", "--config-dir=/nonexistent"}, want: "configuration: stat /nonexistent/cluster.json"},
		"invalid cluster record":   {args: []string{"--api-server-endpoint=10.42.0.10:6443", "--config-dir=" + dir}, want: "cluster.json: invalid cluster record"},
		"negative handshake limit": {args: []string{"--api-server-endpoint=10.42.0.10:6443", "--max-handshakes-per-peer=-1"}, want: "--max-handshakes-per-peer -1: must not be negative"},
	} {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), tc.args, func(string) string { return "" }, io.Discard)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// writeFile replaces dir/name atomically, as kubelet's swap of a mounted ConfigMap does.
func writeFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	require.NoError(t, os.WriteFile(tmp, data, 0o600))
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, name)))
}

// writeKubeconfig points at an API server that is never contacted: a rejoin needs none.
func startKeyService(t *testing.T, master kms.MasterSecret, tlsData map[string][]byte) string {
	t.Helper()
	srv, err := keyservice.NewServer(master, keyservice.DefaultPolicy(), nil, nil)
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(tlsData[clusterrecord.KeyServiceCertKey], tlsData[clusterrecord.KeyServiceKeyKey])
	require.NoError(t, err)
	cas, err := pki.ParseCert(tlsData[clusterrecord.KeyServiceCAKey])
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cas)
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(keyservice.ServerTLS(cert, pool))))
	srv.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

func startMetadata(t *testing.T, instances string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/instances" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(instances))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// markerRegister is the register of qemu-vtpm that carries the cluster-ID marker.
var markerRegister, _ = variant.QEMUVTPM.ClusterIDRegister()
