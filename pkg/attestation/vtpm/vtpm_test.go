package vtpm_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// backends runs fn against the simulator and a real swtpm process.
func backends(t *testing.T, fn func(t *testing.T, tpm *vtpm.TPM)) {
	t.Run("simulator", func(t *testing.T) { fn(t, vtpmtest.Simulator(t)) })
	t.Run("swtpm", func(t *testing.T) {
		tpm, _ := vtpmtest.Swtpm(t)
		fn(t, tpm)
	})
}

func TestExtendAndReadPCR(t *testing.T) {
	backends(t, func(t *testing.T, tpm *vtpm.TPM) {
		before, err := tpm.ReadPCRs()
		require.NoError(t, err)
		require.Len(t, before, vtpm.NumPCRs)

		digest := sha256.Sum256([]byte("bootstrapper"))
		require.NoError(t, tpm.ExtendPCR(16, digest[:]))

		after, err := tpm.ReadPCRs(16, 17)
		require.NoError(t, err)
		want := sha256.Sum256(append(bytes.Clone(before[16]), digest[:]...))
		assert.Equal(t, want[:], after[16])
		assert.Equal(t, before[17], after[17], "other PCRs unchanged")

		assert.ErrorContains(t, tpm.ExtendPCR(24, digest[:]), "out of range")
		assert.ErrorContains(t, tpm.ExtendPCR(16, digest[:20]), "digest has 20 bytes")
	})
}

func TestNVRoundTrip(t *testing.T) {
	backends(t, func(t *testing.T, tpm *vtpm.TPM) {
		_, err := tpm.ReadNV(vtpm.AKCertNVIndex)
		require.ErrorIs(t, err, vtpm.ErrNVNotDefined)

		big := bytes.Repeat([]byte("0123456789abcdef"), 90) // 1440 bytes: several write chunks
		require.NoError(t, tpm.WriteNV(vtpm.AKCertNVIndex, big))
		got, err := tpm.ReadNV(vtpm.AKCertNVIndex)
		require.NoError(t, err)
		assert.Equal(t, big, got)

		require.NoError(t, tpm.WriteNV(vtpm.AKCertNVIndex, []byte("short")), "an existing index is replaced")
		got, err = tpm.ReadNV(vtpm.AKCertNVIndex)
		require.NoError(t, err)
		assert.Equal(t, []byte("short"), got)

		assert.Error(t, tpm.WriteNV(vtpm.AKCertNVIndex, make([]byte, 4096)))
	})
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	_, err := vtpm.Open(ctx, "unix:/nonexistent/tpm.sock")
	assert.ErrorContains(t, err, "connecting to TPM at unix:/nonexistent/tpm.sock")
	_, err = vtpm.Open(ctx, "/nonexistent/tpmrm0")
	assert.ErrorContains(t, err, "opening TPM device /nonexistent/tpmrm0")
}

// TestOpenTCP reaches a swtpm over TCP (through a loopback forwarder to its unix socket), the
// transport of a swtpm started with --server type=tcp.
func TestOpenTCP(t *testing.T) {
	helperConn, proc := vtpmtest.Swtpm(t)
	// The helper holds swtpm's single connection; release it so the forwarder can connect.
	require.NoError(t, helperConn.Close())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("unix", strings.TrimPrefix(proc.Addr(), "unix:"))
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()

	tpm, err := vtpm.Open(context.Background(), "tcp:"+ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { tpm.Close() })
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	assert.Len(t, pcrs, vtpm.NumPCRs)
}
