package snpissuer

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNoGuestDevice: on a machine that is no SEV-SNP guest, the source says so when asked for
// a report (building it succeeds, so a node can decide later what it runs on), and it looks
// for the device once per request until one is found.
func TestNoGuestDevice(t *testing.T) {
	src, err := New(Config{ReportData: func(_, nonce []byte) ([abi.ReportDataSize]byte, error) {
		var rd [abi.ReportDataSize]byte
		copy(rd[:], nonce)
		return rd, nil
	}})
	require.NoError(t, err)
	lookups := 0
	src.find = func() (client.QuoteProvider, error) {
		lookups++
		return nil, errors.New("neither configfs-tsm nor /dev/sev-guest")
	}
	for range 2 {
		_, err = src.Hardware(context.Background(), nil, []byte("a nonce of thirty-two bytes....."))
		require.ErrorContains(t, err, "no SEV-SNP guest device")
		assert.ErrorContains(t, err, "neither configfs-tsm nor /dev/sev-guest")
	}
	assert.Equal(t, 2, lookups)
}
