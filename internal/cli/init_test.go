package cli

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-eventlog/tcg"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// hostile returns n bytes of what a node sends to act on the operator's terminal: clear the
// screen, set the window title, return to the line's start and forge a line.
func hostile(n int) string {
	const s = "\x1b[2J\x1b]0;pwned\x07\r\n[init] forged: everything is fine "
	return strings.Repeat(s, n/len(s)+1)[:n]
}

// hostileInit is an init server that passed the attested handshake (it runs the expected
// image) and then says what it likes: progress messages, its log, its error status.
type hostileInit struct {
	initpb.UnimplementedInitServiceServer
	progress string
	logs     []string
	err      error
}

func (h hostileInit) Init(_ *initpb.InitRequest, stream grpc.ServerStreamingServer[initpb.InitResponse]) error {
	if err := stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Progress{Progress: &initpb.InitProgress{Message: h.progress}}}); err != nil {
		return err
	}
	for _, l := range h.logs {
		if err := stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Log{Log: &initpb.InitLog{Data: []byte(l)}}}); err != nil {
			return err
		}
	}
	return h.err
}

// initNode serves srv over the attested channel with a simulated TPM booted with one image
// component, and returns its address and the reference sets of that image.
func initNode(t *testing.T, srv initpb.InitServiceServer) (string, measurements.ReferenceSets) {
	t.Helper()
	tpm := vtpmtest.Simulator(t)
	log := eventlogtest.Boot(t, tpm, []eventlogtest.Measurement{{PCR: 11, Type: tcg.Ipl, Data: []byte("bootstrapper")}})
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	iss, err := qemu.NewIssuer(tpm, nil, func() ([]byte, error) { return log, nil })
	require.NoError(t, err)
	creds, err := atls.NewCredentials(atls.Config{Issuer: iss})
	require.NoError(t, err)
	g := grpc.NewServer(grpc.Creds(creds))
	initpb.RegisterInitServiceServer(g, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String(), measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.FromRegisters(qemu.Variant, pcrs)}}
}

func dialTCP(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// assertSafe fails unless s is at most 1 KiB and has nothing a terminal acts on.
func assertSafe(t *testing.T, s string) {
	t.Helper()
	assert.LessOrEqual(t, len(s), 1<<10)
	for _, c := range []string{"\x1b", "\x07", "\r", "\n"} {
		assert.NotContains(t, s, c)
	}
}

// TestInitHostileNode: a node that passed attestation (the image is right; its software
// misbehaves, or was made to) streams escape sequences and line breaks in its progress
// messages, megabytes of them in its log, and 256 KiB in its error status. The CLI prints
// every line bounded and escaped, keeps a bounded tail of the log, and returns a bounded,
// escaped error.
func TestInitHostileNode(t *testing.T) {
	var logs []string
	for range 16 {
		logs = append(logs, hostile(64<<10)) // 1 MiB in 64 KiB chunks, as the node sends them
	}
	logs = append(logs, "\n[kubelet-check] the last line says why\n")
	addr, sets := initNode(t, hostileInit{
		progress: hostile(64 << 10),
		logs:     logs,
		err:      status.Error(codes.Internal, hostile(256<<10)),
	})
	v, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var out bytes.Buffer
	_, err = callInit(ctx, &out, addr, v, dialTCP, &initpb.InitRequest{})
	require.Error(t, err)
	assert.Equal(t, codes.Internal, status.Code(errors.Unwrap(err)), "the node's status code is kept")
	assert.Contains(t, err.Error(), `init: rpc error: code = Internal desc = \x1b[2J\x1b]0;pwned\a\r\n`)
	assertSafe(t, err.Error())

	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	assert.LessOrEqual(t, len(lines), untrusted.LogLines+3, "the progress line, the header, the note and the kept lines")
	assert.LessOrEqual(t, out.Len(), 128<<10, "the output is bounded, not the megabyte the node sent")
	for _, l := range lines {
		assertSafe(t, l)
	}
	assert.Contains(t, lines[0], `\x1b[2J`, "the progress message, escaped")
	assert.Equal(t, "--- node logs ---", lines[1])
	assert.Contains(t, lines[2], "earlier bytes not kept")
	assert.Equal(t, "[kubelet-check] the last line says why", lines[len(lines)-1], "the log's end is kept")
}

// A node that does not run the expected image: the error is the CLI's own handshake
// failure, whole (every mismatching register), not gRPC's flattened status.
func TestInitRefusedNodeNamesTheMismatch(t *testing.T) {
	addr, _ := initNode(t, hostileInit{})
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon:         attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "expected", Measurements: measurementstest.Image(qemu.Variant, nil)}}},
		AcceptUnauthenticatedAK: true,
	})
	require.NoError(t, err)
	// The call waits for a ready connection until its deadline: the refusal is that wait.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = callInit(ctx, &bytes.Buffer{}, addr, v, dialTCP, &initpb.InitRequest{})
	require.Error(t, err)
	var e *atls.Error
	require.ErrorAs(t, err, &e)
	assert.ErrorIs(t, err, attestation.ErrMeasurementPolicy)
	assert.Contains(t, err.Error(), `closest is "expected" with 1 mismatching register(s): PCR 11: expected`)
}

// apply reads the join service's log (JSON lines) to say why a node was not admitted: the
// reason and error fields decode to whatever bytes the line escaped, peer strings among
// them; they are printed escaped and bounded.
func TestRejectionsPrintSafely(t *testing.T) {
	r := rejections{refusals.Refusal{Count: 3, Reason: hostile(4 << 10), Error: hostile(256 << 10)}}
	got := r.String()
	assert.Contains(t, got, "the join service rejected it 3 time(s), last: ")
	assert.Contains(t, got, `\x1b[2J`)
	for _, c := range []string{"\x1b", "\x07", "\r", "\n"} {
		assert.NotContains(t, got, c)
	}
	assert.LessOrEqual(t, len(got), 2*(untrusted.MaxTextBytes+32)+64)
}

// TestInitWaitsForTheListener: while the node boots nothing listens at its init address; the
// connection attempt keeps knocking (every initPoll) and connects once the node listens,
// instead of failing or waiting out gRPC's growing back-off.
func TestInitWaitsForTheListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // the node is not up yet: connections are refused

	attempts := 0
	up := make(chan net.Listener, 1)
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		attempts++
		if attempts == 3 { // the node starts listening
			l, err := net.Listen("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { l.Close() })
			up <- l
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := untilListening(&bytes.Buffer{}, dial)(ctx, addr)
	require.NoError(t, err)
	conn.Close()
	assert.Equal(t, 3, attempts)
	<-up

	// A context that ends while nothing listens ends the wait with the last refusal.
	ctx, cancel = context.WithTimeout(t.Context(), 3*initPoll)
	defer cancel()
	refused := func(ctx context.Context, _ string) (net.Conn, error) {
		return nil, errors.New("connect: connection refused")
	}
	_, err = untilListening(&bytes.Buffer{}, refused)(ctx, addr)
	assert.ErrorContains(t, err, "connection refused")
}
