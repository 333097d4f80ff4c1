// Package vtpm gives access to a TPM 2.0 (a kernel device, a swtpm socket, or any
// io.ReadWriteCloser such as the go-tpm-tools simulator in tests) and implements the TPM-quote
// evidence shared by every TPM-based attestation variant: issuing a quote over the SHA-256 PCR
// bank and validating it.
//
// A TPM executes one command at a time and has no resource manager behind a socket, so TPM
// serializes all use of the underlying connection.
package vtpm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// NumPCRs is the number of PCRs of the SHA-256 bank of a PC-client TPM.
const NumPCRs = 24

// commandTimeout bounds one TPM command on a socket. Creating an RSA primary key in a software
// TPM is the slowest command we send (hundreds of milliseconds); anything near this limit means
// the TPM is gone.
const commandTimeout = 30 * time.Second

// TPM is a handle to one TPM with serialized access.
type TPM struct {
	mu   sync.Mutex
	rwc  io.ReadWriteCloser
	desc string
}

// New wraps an open TPM connection, for example the go-tpm-tools simulator.
func New(rwc io.ReadWriteCloser, desc string) *TPM {
	return &TPM{rwc: rwc, desc: desc}
}

// Open opens the TPM at addr:
//   - "unix:PATH": a swtpm (or other raw TPM command) server on a unix socket;
//   - "tcp:HOST:PORT": the same on TCP;
//   - anything else: a TPM character device such as /dev/tpmrm0.
func Open(ctx context.Context, addr string) (*TPM, error) {
	var rwc io.ReadWriteCloser
	switch {
	case strings.HasPrefix(addr, "unix:"), strings.HasPrefix(addr, "tcp:"):
		network, address, _ := strings.Cut(addr, ":")
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, address)
		if err != nil {
			return nil, fmt.Errorf("connecting to TPM at %s: %w", addr, err)
		}
		rwc = &streamTransport{conn: conn}
	default:
		dev, err := tpm2.OpenTPM(addr)
		if err != nil {
			return nil, fmt.Errorf("opening TPM device %s: %w", addr, err)
		}
		rwc = dev
	}
	t := New(rwc, addr)
	// Prove it speaks TPM 2.0 before handing it out. A swtpm serving another process answers
	// only once that process lets go: give up when ctx ends rather than after commandTimeout.
	stop := t.abortOn(ctx)
	defer stop()
	if err := t.With(func(rw io.ReadWriter) error {
		_, err := tpm2.GetManufacturer(rw)
		return err
	}); err != nil {
		rwc.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("TPM at %s did not answer in time (busy with another user?): %w", addr, ctx.Err())
		}
		return nil, fmt.Errorf("TPM at %s does not answer as a TPM 2.0: %w", addr, err)
	}
	return t, nil
}

// String describes where the TPM is.
func (t *TPM) String() string { return t.desc }

// With runs fn with exclusive use of the TPM. Keys created inside fn keep a reference to rw and
// may only be used inside later With calls.
func (t *TPM) With(fn func(rw io.ReadWriter) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rwc == nil {
		return errors.New("TPM is closed")
	}
	return fn(t.rwc)
}

// Close closes the connection to the TPM.
func (t *TPM) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rwc == nil {
		return nil
	}
	err := t.rwc.Close()
	t.rwc = nil
	return err
}

// abortOn makes the end of ctx abort the TPM command in flight and fail every later one, for
// a TPM on a socket (a device command cannot be interrupted; it is bounded by the kernel). A
// connection aborted mid-command is unusable: close it. The returned function ends the
// binding and reports whether it did so before ctx ended.
func (t *TPM) abortOn(ctx context.Context) (stop func() bool) {
	t.mu.Lock()
	a, ok := t.rwc.(interface{ abort() })
	t.mu.Unlock()
	if !ok {
		return func() bool { return true }
	}
	return context.AfterFunc(ctx, a.abort)
}

// ReadPCRs returns the SHA-256 bank values of the given PCRs (all of them when none given).
func (t *TPM) ReadPCRs(pcrs ...int) (map[uint32][]byte, error) {
	if len(pcrs) == 0 {
		pcrs = allPCRs()
	}
	out := make(map[uint32][]byte, len(pcrs))
	err := t.With(func(rw io.ReadWriter) error {
		// TPM2_PCR_Read returns at most 8 digests per call.
		for start := 0; start < len(pcrs); start += 8 {
			chunk := pcrs[start:min(start+8, len(pcrs))]
			vals, err := tpm2.ReadPCRs(rw, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: chunk})
			if err != nil {
				return err
			}
			for _, idx := range chunk {
				v, ok := vals[idx]
				if !ok {
					return fmt.Errorf("TPM did not return PCR %d", idx)
				}
				out[uint32(idx)] = v
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading PCRs from %s: %w", t.desc, err)
	}
	return out, nil
}

// ExtendPCR extends the SHA-256 bank of PCR idx with a 32-byte digest.
func (t *TPM) ExtendPCR(idx int, digest []byte) error {
	if idx < 0 || idx >= NumPCRs {
		return fmt.Errorf("PCR index %d out of range", idx)
	}
	if len(digest) != 32 {
		return fmt.Errorf("extending PCR %d: digest has %d bytes, want 32", idx, len(digest))
	}
	err := t.With(func(rw io.ReadWriter) error {
		return tpm2.PCRExtend(rw, tpmutil.Handle(idx), tpm2.AlgSHA256, digest, "")
	})
	if err != nil {
		return fmt.Errorf("extending PCR %d on %s: %w", idx, t.desc, err)
	}
	return nil
}

func allPCRs() []int {
	pcrs := make([]int, NumPCRs)
	for i := range pcrs {
		pcrs[i] = i
	}
	return pcrs
}

// streamTransport adapts a byte stream to go-tpm, which writes one command and expects the
// whole response from a single Read (true for a TPM device, not for a socket where a response
// may arrive in pieces). Read returns exactly one complete response.
type streamTransport struct {
	conn    net.Conn
	resp    []byte
	aborted atomic.Bool
}

// errAborted fails commands on a connection whose user's context ended.
var errAborted = errors.New("TPM use aborted: the caller's context ended")

// abort fails the command in flight (by an expired deadline) and every later one.
func (s *streamTransport) abort() {
	s.aborted.Store(true)
	_ = s.conn.SetDeadline(time.Unix(1, 0))
}

// maxResponse is the largest TPM response we accept (TPM2 responses are bounded by the TPM's
// MAX_RESPONSE_SIZE, 4096 on swtpm and real chips).
const maxResponse = 8192

func (s *streamTransport) Write(cmd []byte) (int, error) {
	if err := s.conn.SetDeadline(time.Now().Add(commandTimeout)); err != nil {
		return 0, err
	}
	// Checked after setting the deadline: an abort racing with this command has either
	// set its flag already or sets its expired deadline after ours.
	if s.aborted.Load() {
		return 0, errAborted
	}
	s.resp = nil
	return s.conn.Write(cmd)
}

func (s *streamTransport) Read(p []byte) (int, error) {
	if s.resp == nil {
		// Response header: tag (2 bytes), size (4 bytes, includes the header), code (4 bytes).
		var hdr [10]byte
		if _, err := io.ReadFull(s.conn, hdr[:]); err != nil {
			if s.aborted.Load() {
				return 0, errAborted
			}
			return 0, fmt.Errorf("reading TPM response header: %w", err)
		}
		size := binary.BigEndian.Uint32(hdr[2:6])
		if size < 10 || size > maxResponse {
			return 0, fmt.Errorf("TPM response size %d out of range", size)
		}
		s.resp = make([]byte, size)
		copy(s.resp, hdr[:])
		if _, err := io.ReadFull(s.conn, s.resp[10:]); err != nil {
			s.resp = nil
			if s.aborted.Load() {
				return 0, errAborted
			}
			return 0, fmt.Errorf("reading TPM response body: %w", err)
		}
	}
	if len(p) < len(s.resp) {
		return 0, io.ErrShortBuffer
	}
	n := copy(p, s.resp)
	s.resp = nil
	return n, nil
}

func (s *streamTransport) Close() error { return s.conn.Close() }
