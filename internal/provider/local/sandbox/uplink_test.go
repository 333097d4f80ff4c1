package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/testtier"
)

// TestUplink: through the uplink a node reaches a server on the host's loopback at the uplink's
// gateway when the host's loopback is allowed, and does not when it is not; the host's own
// forwarding switch is never touched, and a stopped uplink's process is gone.
func TestUplink(t *testing.T) {
	testtier.Integration(t, "network namespaces and slirp4netns, as root")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "from the host") }))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	hostForwarding := func() string {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		require.NoError(t, err)
		return strings.TrimSpace(string(b))
	}
	before := hostForwarding()

	for name, hostLoopback := range map[string]bool{"host loopback allowed": true, "host loopback refused": false} {
		t.Run(name, func(t *testing.T) {
			idBytes := make([]byte, 3)
			_, _ = rand.Read(idBytes)
			n := Network{ID: hex.EncodeToString(idBytes)}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			t.Cleanup(func() { _ = n.Delete(context.Background(), []string{"a"}) })
			require.NoError(t, n.CreateBridge(ctx))
			require.NoError(t, n.AddNode(ctx, "a", 0, []int{0}))

			u, err := n.StartUplink(ctx, hostLoopback)
			require.NoError(t, err)
			t.Cleanup(u.Stop)

			client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
				DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
					return DialContext(ctx, NSPath(n.NodeNS("a")), network, addr)
				},
			}}
			resp, err := client.Get("http://" + net.JoinHostPort(UplinkGateway.String(), port) + "/")
			if !hostLoopback {
				require.Error(t, err, "the host's loopback is out of reach")
			} else {
				require.NoError(t, err)
				defer resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode)
			}
			assert.Equal(t, before, hostForwarding(), "the host's forwarding is left alone")

			u.Stop()
			select {
			case <-u.Done():
			default:
				t.Fatal("slirp4netns still runs after Stop")
			}
			_, err = os.Stat(fmt.Sprintf("/proc/%d", u.PID()))
			assert.True(t, os.IsNotExist(err), "slirp4netns process %d is gone", u.PID())
		})
	}
}
