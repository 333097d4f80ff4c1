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

// asyncWriter sends frames from its own goroutine, so both sides of the exchange can write
// (possibly large) evidence at the same time without deadlocking on full socket buffers.
type asyncWriter struct {
	frames chan *atlspb.Frame
	done   chan error
}

func newAsyncWriter(w io.Writer) *asyncWriter {
	aw := &asyncWriter{frames: make(chan *atlspb.Frame, 4), done: make(chan error, 1)}
	go func() {
		var err error
		for f := range aw.frames {
			if err == nil {
				err = writeFrame(w, f)
			}
		}
		aw.done <- err
	}()
	return aw
}

func (aw *asyncWriter) send(f *atlspb.Frame) { aw.frames <- f }

// finish waits until every frame was written and returns the first write error.
func (aw *asyncWriter) finish() error {
	close(aw.frames)
	return <-aw.done
}
