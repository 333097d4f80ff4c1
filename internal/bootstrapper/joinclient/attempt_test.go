package joinclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// testEvidence is what fakeIssuer issues; fakeValidator accepts exactly it, or refuses
// everything. Enough for the kinds of failure; the attestation itself is tested with real
// TPMs in the join tests.
var testEvidence = []byte("test evidence")

type fakeIssuer struct{}

func (fakeIssuer) Variant() variant.Variant { return variant.QEMUVTPM }

func (fakeIssuer) Issue(context.Context, attestation.Purpose, []byte) ([]byte, error) {
	return testEvidence, nil
}

type fakeValidator struct{ refuse bool }

func (fakeValidator) Variant() variant.Variant { return variant.QEMUVTPM }

func (v fakeValidator) Validate(_ context.Context, evidence []byte, _ attestation.Purpose, _ []byte) (*attestation.Verified, error) {
	if v.refuse || !bytes.Equal(evidence, testEvidence) {
		return nil, attestation.ErrMeasurementPolicy
	}
	return &attestation.Verified{Variant: variant.QEMUVTPM}, nil
}

// answeringService answers every join request with its status (a ticket when OK).
type answeringService struct {
	joinpb.UnimplementedJoinServiceServer
	status *status.Status
}

func (s answeringService) IssueJoinTicket(context.Context, *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, error) {
	if s.status.Code() != codes.OK {
		return nil, s.status.Err()
	}
	return &joinpb.IssueJoinTicketResponse{}, nil
}

// serveAttested runs a gRPC server with the attested channel's credentials, as the join
// service does, answering with st.
func serveAttested(t *testing.T, cfg atls.Config, st *status.Status) string {
	t.Helper()
	creds, err := atls.NewCredentials(cfg)
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(creds))
	joinpb.RegisterJoinServiceServer(srv, answeringService{status: st})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// freeAddr returns a loopback address nothing listens on (for now).
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// How gRPC and the attested channel report each way an attempt can fail, and the kind the
// join client makes of it. The point of the table: gRPC reports a refused TCP connection, a
// refused attested handshake and a service whose dependencies are down all as
// codes.Unavailable (checked here, so that a gRPC upgrade changing it is noticed), and only
// the first is "nothing answered". The join client tells them apart by whether the TCP
// connection was established, never by the message.
func TestAttemptKinds(t *testing.T) {
	serviceCfg := atls.Config{Issuer: fakeIssuer{}, Validators: []attestation.Validator{fakeValidator{}}}
	attested := func(t *testing.T) joinclient.Dialer {
		dial, err := joinclient.AttestedDialer(fakeIssuer{}, fakeValidator{})
		require.NoError(t, err)
		return dial
	}
	// exhaustedLimiter is the join service's handshake limiter with its one token spent.
	exhaustedLimiter := func(t *testing.T) *handshakelimit.Limiter {
		l, err := handshakelimit.New(handshakelimit.Limits{Rate: 1e-6, Burst: 1, PerPeer: 1, Concurrent: 1}, time.Now)
		require.NoError(t, err)
		release, err := l.Admit(context.Background(), &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		release()
		return l
	}
	testCases := map[string]struct {
		endpoint func(t *testing.T) string
		dial     func(t *testing.T) joinclient.Dialer
		wantKind joinclient.Kind // 0: a ticket
		// wantGRPC is what gRPC reports (the code of the RPC's error) where that is the point.
		wantGRPC codes.Code
		// wantReason is in the attempt's error.
		wantReason string
		// wantHandshake: the error is the attested handshake's, with this side's verdict.
		wantHandshake *atls.Error
	}{
		"nothing listens (TCP connection refused)": {
			endpoint:   func(t *testing.T) string { return freeAddr(t) },
			wantKind:   joinclient.Unreachable,
			wantGRPC:   codes.Unavailable,
			wantReason: "connection refused",
		},
		"nothing listens, through a dialer that passes the context on": {
			endpoint: func(t *testing.T) string { return freeAddr(t) },
			dial: func(t *testing.T) joinclient.Dialer {
				inner := attested(t)
				return func(ctx context.Context, ep string) (*grpc.ClientConn, error) { return inner(ctx, ep) }
			},
			wantKind:   joinclient.Unreachable,
			wantReason: "connection refused",
		},
		"nothing listens, through a dialer that drops the observer: counted as refused (cautious)": {
			endpoint: func(t *testing.T) string { return freeAddr(t) },
			dial: func(t *testing.T) joinclient.Dialer {
				inner := attested(t)
				return func(_ context.Context, ep string) (*grpc.ClientConn, error) { return inner(context.Background(), ep) }
			},
			wantKind:   joinclient.Refused,
			wantReason: "connection refused",
		},
		"TCP accepted, the ClientHello read, then closed (FIN)": {
			endpoint: func(t *testing.T) string {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				t.Cleanup(func() { ln.Close() })
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						// Read what the node sent, so that the close is an orderly one.
						_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
						_, _ = io.Copy(io.Discard, c)
						c.Close()
					}
				}()
				return ln.Addr().String()
			},
			wantKind:      joinclient.Refused,
			wantGRPC:      codes.Unavailable,
			wantHandshake: &atls.Error{Local: true, Reason: "protocol"},
		},
		"reset by the service's accept bounds before a byte (handshakelimit.AcceptLimiter, full)": {
			endpoint: func(t *testing.T) string {
				// The accept bounds every attesting server is served through, with room for one
				// pending connection per address, which a stalled caller of this address holds.
				limiter, err := handshakelimit.NewAcceptLimiter(handshakelimit.AcceptLimits{PerPeer: 1, Total: 1, Timeout: time.Minute}, nil)
				require.NoError(t, err)
				raw, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				ln := limiter.Listener(raw)
				t.Cleanup(func() { ln.Close() }) // also closes the pending connection
				go func() {
					for {
						if _, err := ln.Accept(); err != nil { // held pending, never served
							return
						}
					}
				}()
				stalled, err := net.Dial("tcp", ln.Addr().String())
				require.NoError(t, err)
				t.Cleanup(func() { stalled.Close() })
				require.Eventually(t, func() bool { return limiter.Pending() == 1 }, 10*time.Second, 10*time.Millisecond)
				return ln.Addr().String()
			},
			// The reset may meet the node's connect or its ClientHello: unreachable either way.
			wantKind:   joinclient.Unreachable,
			wantReason: "connection reset by peer",
		},
		"TCP accepted, never answered (overloaded)": {
			endpoint: func(t *testing.T) string {
				ln, err := net.Listen("tcp", "127.0.0.1:0") // the kernel completes the TCP handshake
				require.NoError(t, err)
				t.Cleanup(func() { ln.Close() })
				return ln.Addr().String()
			},
			wantKind:   joinclient.Refused,
			wantGRPC:   codes.DeadlineExceeded,
			wantReason: "did not complete the attested handshake",
		},
		"the service's handshake limiter refuses the node": {
			endpoint: func(t *testing.T) string {
				cfg := serviceCfg
				cfg.Admit = exhaustedLimiter(t).Admit
				return serveAttested(t, cfg, status.New(codes.OK, ""))
			},
			wantKind:      joinclient.Refused,
			wantGRPC:      codes.Unavailable,
			wantReason:    "rate limited",
			wantHandshake: &atls.Error{Local: false, Reason: "peer-abort"},
		},
		"the service refuses the node's evidence": {
			endpoint: func(t *testing.T) string {
				return serveAttested(t, atls.Config{Issuer: fakeIssuer{}, Validators: []attestation.Validator{fakeValidator{refuse: true}}}, status.New(codes.OK, ""))
			},
			wantKind:      joinclient.Refused,
			wantGRPC:      codes.Unavailable,
			wantReason:    "measurements do not match",
			wantHandshake: &atls.Error{Local: false, Reason: "peer-abort"},
		},
		"the node refuses the service's evidence": {
			endpoint: func(t *testing.T) string { return serveAttested(t, serviceCfg, status.New(codes.OK, "")) },
			dial: func(t *testing.T) joinclient.Dialer {
				dial, err := joinclient.AttestedDialer(fakeIssuer{}, fakeValidator{refuse: true})
				require.NoError(t, err)
				return dial
			},
			wantKind:      joinclient.Refused,
			wantGRPC:      codes.Unavailable,
			wantReason:    "measurements do not match",
			wantHandshake: &atls.Error{Local: true, Reason: "measurement-mismatch"},
		},
		"the service answers Unavailable (its API server is down)": {
			endpoint: func(t *testing.T) string {
				return serveAttested(t, serviceCfg, status.New(codes.Unavailable, "creating bootstrap token: connection refused"))
			},
			wantKind:   joinclient.Refused,
			wantGRPC:   codes.Unavailable,
			wantReason: "creating bootstrap token",
		},
		"the service answers PermissionDenied": {
			endpoint: func(t *testing.T) string {
				return serveAttested(t, serviceCfg, status.New(codes.PermissionDenied, "platform does not know this node"))
			},
			wantKind: joinclient.Refused, wantGRPC: codes.PermissionDenied, wantReason: "platform does not know this node",
		},
		"the service answers ResourceExhausted": {
			endpoint: func(t *testing.T) string {
				return serveAttested(t, serviceCfg, status.New(codes.ResourceExhausted, "busy"))
			},
			wantKind: joinclient.Refused, wantGRPC: codes.ResourceExhausted,
		},
		"the service answers FailedPrecondition": {
			endpoint: func(t *testing.T) string {
				return serveAttested(t, serviceCfg, status.New(codes.FailedPrecondition, "not ready"))
			},
			wantKind: joinclient.Refused, wantGRPC: codes.FailedPrecondition,
		},
		"the service answers InvalidArgument": {
			endpoint: func(t *testing.T) string {
				return serveAttested(t, serviceCfg, status.New(codes.InvalidArgument, "disk UUID"))
			},
			wantKind: joinclient.Refused, wantGRPC: codes.InvalidArgument,
		},
		"the service issues a ticket": {
			endpoint: func(t *testing.T) string { return serveAttested(t, serviceCfg, status.New(codes.OK, "")) },
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			dial := attested(t)
			if tc.dial != nil {
				dial = tc.dial(t)
			}
			err := joinclient.TryIssueJoinTicket(context.Background(), dial, tc.endpoint(t), 500*time.Millisecond)
			if tc.wantKind == 0 {
				require.NoError(t, err)
				return
			}
			var failed *joinclient.AttemptError
			require.ErrorAs(t, err, &failed)
			assert.Equal(t, tc.wantKind, failed.Kind, "kind; error: %v", err)
			assert.ErrorContains(t, err, tc.wantReason)
			if tc.wantGRPC != codes.OK && tc.wantHandshake == nil {
				assert.Equal(t, tc.wantGRPC, status.Code(failed.Err), "gRPC code; error: %v", err)
			}
			if tc.wantHandshake != nil {
				var hs *atls.Error
				require.ErrorAs(t, err, &hs, "the attested handshake's own error")
				assert.Equal(t, tc.wantHandshake.Local, hs.Local, "Local")
				assert.Equal(t, tc.wantHandshake.Reason, hs.Reason, "Reason")
			}
		})
	}
}

// What gRPC itself reports for a failed attested handshake: codes.Unavailable with the
// handshake's error flattened into the message, nothing to errors.As. This is why the join
// client observes the connection instead of reading the RPC's error.
func TestGRPCFlattensHandshakeFailures(t *testing.T) {
	addr := serveAttested(t, atls.Config{Issuer: fakeIssuer{}, Validators: []attestation.Validator{fakeValidator{refuse: true}}}, status.New(codes.OK, ""))
	creds, err := atls.NewCredentials(atls.Config{Issuer: fakeIssuer{}, Validators: []attestation.Validator{fakeValidator{}}})
	require.NoError(t, err)
	for name, endpoint := range map[string]string{"refused handshake": addr, "refused TCP connection": freeAddr(t)} {
		conn, err := grpc.NewClient("passthrough:///"+endpoint, grpc.WithTransportCredentials(creds))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = joinpb.NewJoinServiceClient(conn).IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{})
		cancel()
		conn.Close()
		assert.Equal(t, codes.Unavailable, status.Code(err), name)
		var hs *atls.Error
		assert.False(t, errors.As(err, &hs), "%s: gRPC keeps the handshake error", name)
	}
}

// A service that passed attestation and answers with 256 KiB of escape sequences and line
// breaks in its status: the attempt's error, which the node logs, is one bounded, escaped
// line, and keeps the status's code.
func TestAttemptHostileStatus(t *testing.T) {
	const s = "\x1b[2J\x1b]0;pwned\x07\r\nlevel=ERROR msg=forged "
	hostile := strings.Repeat(s, (256<<10)/len(s))
	serviceCfg := atls.Config{Issuer: fakeIssuer{}, Validators: []attestation.Validator{fakeValidator{}}}
	addr := serveAttested(t, serviceCfg, status.New(codes.PermissionDenied, hostile))
	dial, err := joinclient.AttestedDialer(fakeIssuer{}, fakeValidator{})
	require.NoError(t, err)

	err = joinclient.TryIssueJoinTicket(context.Background(), dial, addr, 5*time.Second)
	var failed *joinclient.AttemptError
	require.ErrorAs(t, err, &failed)
	assert.Equal(t, joinclient.Refused, failed.Kind)
	assert.Equal(t, codes.PermissionDenied, status.Code(failed.Err))
	assert.Contains(t, err.Error(), `\x1b[2J\x1b]0;pwned\a\r\n`)
	assert.LessOrEqual(t, len(err.Error()), 1<<10)
	for _, c := range []string{"\x1b", "\x07", "\r", "\n"} {
		assert.NotContains(t, err.Error(), c)
	}
}
