package sandbox_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
)

func TestBridgeMAC(t *testing.T) {
	mac, err := sandbox.BridgeMAC(netip.MustParseAddr("10.244.5.1"))
	require.NoError(t, err)
	assert.Equal(t, "02:00:0a:f4:05:01", mac)
	_, err = sandbox.BridgeMAC(netip.MustParseAddr("fd00::1"))
	assert.Error(t, err)
}
