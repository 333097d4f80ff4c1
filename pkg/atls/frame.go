package atls

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/atls/atlspb"
)

// maxHelloFrame bounds frames other than Evidence: a Hello lists a few variant names.
const maxHelloFrame = 4 << 10

// frameOverhead is what an Evidence frame adds around the evidence bytes.
const frameOverhead = 1 << 10

// errFrameTooLarge marks a frame whose announced length exceeds the limit.
var errFrameTooLarge = errors.New("frame too large")

// writeFrame writes one length-prefixed frame.
func writeFrame(w io.Writer, f *atlspb.Frame) error {
	payload, err := proto.Marshal(f)
	if err != nil {
		return err
	}
	buf := make([]byte, 4+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(len(payload)))
	copy(buf[4:], payload)
	_, err = w.Write(buf)
	return err
}

// readFrame reads one frame of at most limit bytes. The length is checked before anything is
// allocated, so a peer cannot make us buffer more than limit.
func readFrame(r io.Reader, limit int) (*atlspb.Frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("reading frame: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(limit) {
		return nil, fmt.Errorf("%w: %d bytes announced, limit %d", errFrameTooLarge, n, limit)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return nil, fmt.Errorf("reading frame: %w", err)
	}
	f := &atlspb.Frame{}
	if err := proto.Unmarshal(payload, f); err != nil {
		return nil, fmt.Errorf("malformed frame: %w", err)
	}
	if f.Kind == nil {
		return nil, errors.New("malformed frame: empty")
	}
	return f, nil
}

// frameWriter writes frames in order, on the caller's goroutine except for one case. Writing
// inline blocks only while the peer does not read, and the protocol always has the peer reading
// except when both sides send their evidence at once (mutual attestation): evidence can be
// larger than the socket buffers, so each side would wait for the other to read. sendBehind
// writes such a frame on its own goroutine while the caller reads; the next frame waits for
// it. Hellos, verdicts and aborts are small (maxHelloFrame). A write that blocks anyway (a peer
// that stopped reading) is bounded by the connection's handshake deadline.
type frameWriter struct {
	w       io.Writer
	pending chan error // the result of the write running behind, nil if none
	err     error      // the first write error
}

func newFrameWriter(w io.Writer) *frameWriter { return &frameWriter{w: w} }

// send writes f once the frame behind (if any) is written. After a write error it writes
// nothing more.
func (fw *frameWriter) send(f *atlspb.Frame) {
	if fw.wait() == nil {
		fw.err = writeFrame(fw.w, f)
	}
}

// sendBehind starts writing f on its own goroutine and returns at once.
func (fw *frameWriter) sendBehind(f *atlspb.Frame) {
	if fw.wait() != nil {
		return
	}
	done := make(chan error, 1)
	fw.pending = done
	go func() { done <- writeFrame(fw.w, f) }()
}

// wait waits for the frame behind and returns the first write error.
func (fw *frameWriter) wait() error {
	if fw.pending != nil {
		if err := <-fw.pending; fw.err == nil {
			fw.err = err
		}
		fw.pending = nil
	}
	return fw.err
}

// finish waits until every frame was written and returns the first write error.
func (fw *frameWriter) finish() error { return fw.wait() }
