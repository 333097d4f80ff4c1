package main

import (
	"context"
	"crypto/tls"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kms/keyservice"
	"github.com/openconstellation/constellation/internal/testnet"
)

// files writes what the DaemonSet mounts: the master secret and the TLS Secret deploy makes.
func files(t *testing.T) (secretPath, tlsDir string, master kms.MasterSecret, tlsData map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	master, err := kms.NewMasterSecret()
	require.NoError(t, err)
	secretPath = filepath.Join(dir, clusterrecord.MasterSecretKey)
	require.NoError(t, kms.WriteMasterSecretFile(secretPath, master))
	tlsData, err = deploy.NewKeyServiceTLS(time.Now())
	require.NoError(t, err)
	tlsDir = filepath.Join(dir, "tls")
	require.NoError(t, os.Mkdir(tlsDir, 0o700))
	for name, data := range tlsData {
		require.NoError(t, os.WriteFile(filepath.Join(tlsDir, name), data, 0o600))
	}
	return secretPath, tlsDir, master, tlsData
}

// The key service serves the join service (its client pair from the same Secret) and no one
// else, with the default policy.
func TestRun(t *testing.T) {
	secretPath, tlsDir, master, tlsData := files(t)
	addr := testnet.Addr(t)
	var logs cmdutil.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	env := map[string]string{"CONSTELLATION_MASTER_SECRET": secretPath, "CONSTELLATION_TLS_DIR": tlsDir}
	go func() { done <- run(ctx, []string{"--listen=" + addr}, func(k string) string { return env[k] }, &logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Error("run did not return after the context ended")
		}
	})

	cert, cas, err := keyservice.LoadCertAndCA(tlsDir, clusterrecord.JoinServiceCertKey, clusterrecord.JoinServiceKeyKey, clusterrecord.KeyServiceCAKey)
	require.NoError(t, err)
	client, err := keyservice.NewClient(addr, deploy.KeyServiceServerName, cert, cas)
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	var got []byte
	require.Eventually(t, func() bool {
		got, err = client.DataKey(ctx, kms.MeasurementID, 32)
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "%v", err)
	want, err := master.MeasurementSecret()
	require.NoError(t, err)
	assert.Equal(t, want, got)
	uuid := "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	diskKey, err := client.DataKey(ctx, uuid, 32)
	require.NoError(t, err)
	want, err = master.StateDiskKey(uuid)
	require.NoError(t, err)
	assert.Equal(t, want, diskKey)
	_, err = client.DataKey(ctx, "key-encryption-key", 32)
	assert.Equal(t, codes.PermissionDenied, status.Code(unwrap(err)), "%v", err)

	// The server pair as a client: right CA, but a server-only certificate, refused in the
	// TLS handshake.
	serverPair, err := tls.X509KeyPair(tlsData[clusterrecord.KeyServiceCertKey], tlsData[clusterrecord.KeyServiceKeyKey])
	require.NoError(t, err)
	impostor, err := keyservice.NewClient(addr, deploy.KeyServiceServerName, serverPair, cas)
	require.NoError(t, err)
	t.Cleanup(func() { impostor.Close() })
	_, err = impostor.DataKey(ctx, kms.MeasurementID, 32)
	assert.Equal(t, codes.Unavailable, status.Code(unwrap(err)), "%v", err)

	// A client certificate of another key-service CA (another cluster's Secret).
	_, otherDir, _, _ := files(t)
	otherCert, _, err := keyservice.LoadCertAndCA(otherDir, clusterrecord.JoinServiceCertKey, clusterrecord.JoinServiceKeyKey, clusterrecord.KeyServiceCAKey)
	require.NoError(t, err)
	stranger, err := keyservice.NewClient(addr, deploy.KeyServiceServerName, otherCert, cas)
	require.NoError(t, err)
	t.Cleanup(func() { stranger.Close() })
	_, err = stranger.DataKey(ctx, kms.MeasurementID, 32)
	assert.Equal(t, codes.Unavailable, status.Code(unwrap(err)), "%v", err)

	assert.Contains(t, logs.String(), `"msg":"key service starting"`)
}

func TestRunRefuses(t *testing.T) {
	secretPath, tlsDir, _, _ := files(t)
	badPolicy := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(badPolicy, []byte(`{"clients":{"joinservice":{"keyIDPrefixes":[""]}}}`), 0o600))
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no master secret": {args: []string{"--master-secret=/nonexistent/mastersecret.json", "--tls-dir=" + tlsDir}, want: "reading master secret"},
		"no TLS":           {args: []string{"--master-secret=" + secretPath, "--tls-dir=/nonexistent"}, want: "key service TLS pair in /nonexistent"},
		"empty prefix":     {args: []string{"--master-secret=" + secretPath, "--tls-dir=" + tlsDir, "--policy=" + badPolicy}, want: "would grant every key id"},
		"argument":         {args: []string{"serve"}, want: "unexpected arguments"},
	} {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), tc.args, func(string) string { return "" }, io.Discard)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func unwrap(err error) error {
	for e := err; e != nil; {
		if _, ok := status.FromError(e); ok {
			return e
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return err
}
