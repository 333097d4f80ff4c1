// Package tpmsocket serves a TPM character device (the kernel's resource manager,
// /dev/tpmrm0) on a unix socket, speaking the raw TPM command/response stream a swtpm socket
// speaks, one device handle per connection. A machine's in-cluster services reach its TPM
// this way, as a sandbox's reach their swtpm: a container can be given a socket, but opening
// a host device needs device-cgroup access (a privileged container) which they are not given.
//
// Each connection opens the device anew, so the kernel's resource manager isolates the
// connections' sessions and transient objects as it isolates processes.
package tpmsocket

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	headerSize = 10 // tag (2), size (4), command or response code (4)
	// MaxMessage bounds a command or response: the TPM 2.0 library's MAX_COMMAND_SIZE and
	// MAX_RESPONSE_SIZE are 4096 on common TPMs; swtpm allows more. 64 KiB is the kernel
	// driver's own buffer bound (TPM_BUFSIZE is 4096, tpmrm the same), with room to spare.
	MaxMessage = 64 << 10
)

// Listen creates the socket at path, readable and writable by its owner only, replacing a
// stale one.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("TPM socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("TPM socket: %w", err)
	}
	return l, nil
}

// Serve accepts connections on l until ctx ends, relaying each one's commands to its own
// handle from open and the responses back.
func Serve(ctx context.Context, l net.Listener, open func() (io.ReadWriteCloser, error), log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("TPM socket: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := relay(ctx, conn, open); err != nil && !errors.Is(err, io.EOF) {
				log.Warn("TPM socket connection ended", "err", err)
			}
		}()
	}
}

// relay passes one connection's commands to a device handle of its own.
func relay(ctx context.Context, conn net.Conn, open func() (io.ReadWriteCloser, error)) error {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	dev, err := open()
	if err != nil {
		return fmt.Errorf("opening the TPM: %w", err)
	}
	defer dev.Close()
	cmd := make([]byte, MaxMessage)
	resp := make([]byte, MaxMessage)
	for {
		n, err := readCommand(conn, cmd)
		if err != nil {
			return err
		}
		if _, err := dev.Write(cmd[:n]); err != nil {
			return fmt.Errorf("writing a command to the TPM: %w", err)
		}
		// The device returns a whole response per read.
		m, err := dev.Read(resp)
		if err != nil {
			return fmt.Errorf("reading the TPM's response: %w", err)
		}
		if _, err := conn.Write(resp[:m]); err != nil {
			return err
		}
	}
}

// readCommand reads one command (header, then the rest of its declared size) into buf.
func readCommand(r io.Reader, buf []byte) (int, error) {
	if _, err := io.ReadFull(r, buf[:headerSize]); err != nil {
		return 0, err
	}
	size := binary.BigEndian.Uint32(buf[2:6])
	if size < headerSize || size > uint32(len(buf)) {
		return 0, fmt.Errorf("command of %d bytes: want %d to %d", size, headerSize, len(buf))
	}
	if _, err := io.ReadFull(r, buf[headerSize:size]); err != nil {
		return 0, fmt.Errorf("reading a command of %d bytes: %w", size, err)
	}
	return int(size), nil
}

// OpenDevice opens a TPM character device in blocking mode. The kernel's TPM driver
// transmits a command synchronously within write(2) only on a blocking file; on a
// non-blocking one (what os.OpenFile makes of a pollable device) write returns at once and
// a read before the TPM has answered returns 0 bytes, which reads as the end of the stream.
// A file from os.NewFile on a blocking descriptor stays blocking.
func OpenDevice(path string) (io.ReadWriteCloser, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
