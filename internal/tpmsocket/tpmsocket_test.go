package tpmsocket

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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

// The device is opened in blocking mode, where the kernel's TPM driver answers within
// write(2) (a non-blocking read before the answer returns 0 bytes: an early end of stream).
func TestOpenDeviceBlocks(t *testing.T) {
	// A FIFO is pollable like the TPM device: os.OpenFile would make it non-blocking.
	path := filepath.Join(t.TempDir(), "dev")
	require.NoError(t, unix.Mkfifo(path, 0o600))
	f, err := OpenDevice(path)
	require.NoError(t, err)
	defer f.Close()
	// SyscallConn, not Fd: Fd itself would switch the file to blocking mode.
	raw, err := f.(*os.File).SyscallConn()
	require.NoError(t, err)
	var flags int
	require.NoError(t, raw.Control(func(fd uintptr) { flags, err = unix.FcntlInt(fd, unix.F_GETFL, 0) }))
	require.NoError(t, err)
	assert.Zero(t, flags&unix.O_NONBLOCK)
	_, err = OpenDevice(filepath.Join(t.TempDir(), "missing"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}
