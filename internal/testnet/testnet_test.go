package testnet

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPorts(t *testing.T) {
	ports, err := Ports(20)
	require.NoError(t, err)
	require.Len(t, ports, 20)
	seen := map[int]bool{}
	for _, p := range ports {
		assert.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
		assert.GreaterOrEqual(t, p, lowest)
		assert.Less(t, p, ephemeralStart(), "below the ephemeral range")
	}
	// Each port is free: a listener gets it.
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(ports[0]))
	require.NoError(t, err)
	defer l.Close()
	assert.False(t, free(ports[0]), "a bound port is not free")
}

func TestAddr(t *testing.T) {
	host, port, err := net.SplitHostPort(Addr(t))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	assert.Less(t, p, ephemeralStart())
}
