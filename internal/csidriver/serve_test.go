package csidriver_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/openconstellation/constellation/internal/csidriver"
)

func TestSocketPath(t *testing.T) {
	testCases := map[string]struct {
		endpoint, want string
		wantErr        bool
	}{
		"unix url":      {endpoint: "unix:///csi/csi.sock", want: "/csi/csi.sock"},
		"plain path":    {endpoint: "/csi/csi.sock", want: "/csi/csi.sock"},
		"tcp":           {endpoint: "tcp://127.0.0.1:10000", wantErr: true},
		"relative":      {endpoint: "unix://csi.sock", wantErr: true},
		"relative path": {endpoint: "csi.sock", wantErr: true},
		"empty":         {endpoint: "", wantErr: true},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := csidriver.SocketPath(tc.endpoint)
			if tc.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func dialUnix(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitForSocket waits until path accepts connections.
func waitForSocket(t *testing.T, path string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, path)
}

func TestServeNode(t *testing.T) {
	dir := t.TempDir()
	pluginDir, regDir := filepath.Join(dir, "plugins"), filepath.Join(dir, "plugins_registry")
	nodeSock, regSock := csidriver.NodeSocket(pluginDir), csidriver.RegistrationSocket(regDir)
	assert.Equal(t, filepath.Join(pluginDir, csidriver.Name, "csi.sock"), nodeSock)
	assert.Equal(t, filepath.Join(regDir, csidriver.Name+"-reg.sock"), regSock)

	// A stale socket of a previous run is replaced.
	require.NoError(t, os.MkdirAll(filepath.Dir(nodeSock), 0o700))
	stale, err := net.Listen("unix", nodeSock)
	require.NoError(t, err)
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, stale.Close())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- csidriver.ServeNode(ctx, pluginDir, regDir, csidriver.NewNode(csidriver.NodeConfig{NodeName: "node-1"}))
	}()
	waitForSocket(t, nodeSock)
	waitForSocket(t, regSock)
	for _, sock := range []string{nodeSock, regSock} {
		st, err := os.Stat(sock)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "only root talks to the driver")
	}

	info, err := registration.NewRegistrationClient(dialUnix(t, regSock)).GetInfo(ctx, &registration.InfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, registration.CSIPlugin, info.GetType())
	assert.Equal(t, csidriver.Name, info.GetName())
	assert.Equal(t, nodeSock, info.GetEndpoint())
	assert.Equal(t, []string{"1.0.0"}, info.GetSupportedVersions())
	_, err = registration.NewRegistrationClient(dialUnix(t, regSock)).NotifyRegistrationStatus(ctx, &registration.RegistrationStatus{Error: "boom"})
	require.NoError(t, err)

	conn := dialUnix(t, nodeSock)
	pi, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, csidriver.Name, pi.GetName())
	ni, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, "node-1", ni.GetNodeId())

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("ServeNode did not stop with its context")
	}
	assert.NoFileExists(t, nodeSock)
	assert.NoFileExists(t, regSock)
}

func TestServeControllerRefusesNonSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "csi.sock")
	require.NoError(t, os.WriteFile(path, []byte("not a socket"), 0o600))
	err := csidriver.ServeController(context.Background(), "unix://"+path, csidriver.NewController(newMemBacking(""), nil))
	assert.ErrorContains(t, err, "not a socket")
	assert.FileExists(t, path)
}
