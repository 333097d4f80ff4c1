package tpmsocket

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

type shared struct{ io.ReadWriter }

func (shared) Close() error { return nil }

func serveSimulator(t *testing.T) string {
	t.Helper()
	sim, err := simulator.Get()
	require.NoError(t, err)
	t.Cleanup(func() { sim.Close() })
	path := filepath.Join(t.TempDir(), "tpm.sock")
	l, err := Listen(path)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, func() (io.ReadWriteCloser, error) { return shared{sim}, nil }, nil) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return path
}

// The vtpm client the services use talks to the device through the socket.
func TestRelaysCommands(t *testing.T) {
	path := serveSimulator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tpm, err := vtpm.Open(ctx, "unix:"+path)
	require.NoError(t, err)
	defer tpm.Close()
	require.NoError(t, tpm.With(func(rw io.ReadWriter) error {
		b, err := tpm2.GetRandom(rw, 16)
		if err == nil && len(b) != 16 {
			t.Errorf("got %d random bytes", len(b))
		}
		return err
	}))
}

// A command whose header declares an impossible size ends the connection; nothing reaches
// the device.
func TestRefusesOversizedCommand(t *testing.T) {
	path := serveSimulator(t)
	conn, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer conn.Close()
	hdr := make([]byte, headerSize)
	binary.BigEndian.PutUint16(hdr, 0x8001)
	binary.BigEndian.PutUint32(hdr[2:], MaxMessage+1)
	_, err = conn.Write(hdr)
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = conn.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the relay closed the connection")
}

func FuzzReadCommand(f *testing.F) {
	f.Add([]byte{0x80, 0x01, 0, 0, 0, 12, 0, 0, 1, 0x7b, 0, 8})
	f.Add([]byte{0x80, 0x01, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		buf := make([]byte, 64)
		n, err := readCommand(bytes.NewReader(data), buf)
		if err == nil && (n < headerSize || n > len(buf)) {
			t.Fatalf("accepted a command of %d bytes", n)
		}
	})
}
