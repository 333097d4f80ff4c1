package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/openconstellation/constellation/internal/csidriver"
)

func noEnv(string) string { return "" }

func TestRunRefuses(t *testing.T) {
	testCases := map[string]struct {
		args    []string
		wantErr string
	}{
		"no command":       {args: nil, wantErr: "usage"},
		"node":             {args: []string{"node"}, wantErr: "node program"},
		"no metadata url":  {args: []string{"controller"}, wantErr: "--metadata-url: missing"},
		"file url":         {args: []string{"controller", "--metadata-url", "file:///etc/passwd"}, wantErr: "http or https"},
		"url with user":    {args: []string{"controller", "--metadata-url", "http://u:p@10.42.0.1:8080"}, wantErr: "scheme://host"},
		"tcp endpoint":     {args: []string{"controller", "--endpoint", "tcp://0.0.0.0:1", "--metadata-url", "http://10.42.0.1:8080"}, wantErr: "--endpoint"},
		"bad log level":    {args: []string{"controller", "--metadata-url", "http://10.42.0.1:8080", "--log-level", "loud"}, wantErr: "loud"},
		"unknown platform": {args: []string{"controller", "--platform", "gcp", "--metadata-url", "http://10.42.0.1:8080"}, wantErr: `--platform: platform "gcp" is not supported (supported: azure, local, qemu)`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), tc.args, noEnv, &bytes.Buffer{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

// nothing is a Backing that has no volumes.
type nothing struct{ csidriver.Backing }

func TestRunController(t *testing.T) {
	var gotPlatform, gotURL string
	orig := newBacking
	newBacking = func(p, u string) (csidriver.Backing, error) { gotPlatform, gotURL = p, u; return nothing{}, nil }
	t.Cleanup(func() { newBacking = orig })

	sock := filepath.Join(t.TempDir(), "csi.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	env := map[string]string{"CONSTELLATION_METADATA_URL": "http://10.42.0.1:8080", "CONSTELLATION_PLATFORM": "qemu"}
	go func() {
		done <- run(ctx, []string{"controller", "--endpoint", "unix://" + sock}, func(k string) string { return env[k] }, &bytes.Buffer{})
	}()
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "http://10.42.0.1:8080", gotURL)
	assert.Equal(t, "qemu", gotPlatform)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, csidriver.Name, info.GetName())
	caps, err := csi.NewControllerClient(conn).ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	require.NoError(t, err)
	assert.Len(t, caps.GetCapabilities(), 3)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("controller did not stop")
	}
}

// Each platform's storage is the one the catalog names: the local providers' volume API, or
// Azure's managed disks found through IMDS.
func TestNewBacking(t *testing.T) {
	for platform, want := range map[string]string{
		"local": "*volumeclient.Client", "qemu": "*volumeclient.Client", "azure": "*azurevolumes.ClusterBacking",
	} {
		b, err := newBacking(platform, "http://10.42.0.1:8080")
		require.NoError(t, err, platform)
		assert.Equal(t, want, fmt.Sprintf("%T", b), platform)
	}
}
