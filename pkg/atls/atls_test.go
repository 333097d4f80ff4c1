package atls_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-eventlog/tcg"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/atls/atlspb"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// node is one TPM with an issuer and the reference set its PCRs satisfy.
type node struct {
	tpm    *vtpm.TPM
	issuer *vtpm.Issuer
	ref    measurements.M
}

// bootNode measures a bootstrapper into tpm, as a provider does, and returns the node with an
// issuer that sends the event log of that boot.
func bootNode(t testing.TB, tpm *vtpm.TPM) *node {
	t.Helper()
	log := eventlogtest.Boot(t, tpm, []eventlogtest.Measurement{{PCR: 4, Type: tcg.Ipl, Data: []byte("bootstrapper")}})
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	ref := measurementstest.FromRegisters(variant.QEMUVTPM, pcrs)
	iss, err := qemu.NewIssuer(tpm, nil, func() ([]byte, error) { return log, nil })
	require.NoError(t, err)
	return &node{tpm: tpm, issuer: iss, ref: ref}
}

// validator checks the node's image. The channel is under test, not the AK's provenance:
// the tests' AKs are uncertified, so the validator accepts that (one test configures roots),
// without logging its warning about it (which would land inside benchmark result lines).
func (n *node) validator(t testing.TB) attestation.Validator {
	t.Helper()
	v, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{
		ReferenceSets: measurements.ReferenceSets{{Name: "image-v1", Measurements: n.ref}}, Log: slog.New(slog.DiscardHandler),
	}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)
	return v
}

func creds(t testing.TB, cfg atls.Config) *atls.Credentials {
	t.Helper()
	c, err := atls.NewCredentials(cfg)
	require.NoError(t, err)
	return c
}

type result struct {
	conn *atls.Conn
	err  error
}

// connect runs one attested handshake over loopback TCP and checks that application data
// flows when both sides succeed.
func connect(t testing.TB, server, client *atls.Credentials) (srv, cli result) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	srvCh := make(chan result, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			srvCh <- result{err: err}
			return
		}
		c, err := server.Server(ctx, raw)
		srvCh <- result{c, err}
	}()
	c, err := client.Dial(ctx, "tcp", ln.Addr().String())
	cli = result{c, err}
	srv = <-srvCh
	for _, r := range []result{srv, cli} {
		if r.conn != nil {
			t.Cleanup(func() { r.conn.Close() })
		}
	}
	if srv.err == nil && cli.err == nil {
		go func() { _, _ = cli.conn.Write([]byte("ping")) }()
		buf := make([]byte, 4)
		_, err := io.ReadFull(srv.conn, buf)
		require.NoError(t, err)
		assert.Equal(t, "ping", string(buf))
	}
	return srv, cli
}

func TestModes(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	testCases := map[string]struct {
		server, client         atls.Config
		serverSees, clientSees bool
	}{
		"server-attested": {
			server:     atls.Config{Issuer: n.issuer},
			client:     atls.Config{Validators: []attestation.Validator{n.validator(t)}},
			clientSees: true,
		},
		"client-attested": {
			server:     atls.Config{Validators: []attestation.Validator{n.validator(t)}},
			client:     atls.Config{Issuer: n.issuer},
			serverSees: true,
		},
		"mutual": {
			server:     atls.Config{Issuer: n.issuer, Validators: []attestation.Validator{n.validator(t)}},
			client:     atls.Config{Issuer: n.issuer, Validators: []attestation.Validator{n.validator(t)}},
			serverSees: true, clientSees: true,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			srv, cli := connect(t, creds(t, tc.server), creds(t, tc.client))
			require.NoError(t, srv.err)
			require.NoError(t, cli.err)
			for _, side := range []struct {
				conn *atls.Conn
				sees bool
			}{{srv.conn, tc.serverSees}, {cli.conn, tc.clientSees}} {
				if !side.sees {
					assert.Nil(t, side.conn.Peer())
					continue
				}
				require.NotNil(t, side.conn.Peer())
				assert.Equal(t, "image-v1", side.conn.Peer().ReferenceSet)
				assert.Equal(t, n.ref[4].Expected, side.conn.Peer().Registers[4])
			}
		})
	}
}

// TestMutualSwtpm runs a mutual handshake between two nodes with their own swtpm processes,
// each accepting the other's image, and checks each side saw the other's AK.
func TestMutualSwtpm(t *testing.T) {
	tpmA, _ := vtpmtest.Swtpm(t)
	tpmB, _ := vtpmtest.Swtpm(t)
	a, b := bootNode(t, tpmA), bootNode(t, tpmB)
	require.Equal(t, a.ref, b.ref, "same image, same measurements")

	srv, cli := connect(t,
		creds(t, atls.Config{Issuer: a.issuer, Validators: []attestation.Validator{b.validator(t)}}),
		creds(t, atls.Config{Issuer: b.issuer, Validators: []attestation.Validator{a.validator(t)}}))
	require.NoError(t, srv.err)
	require.NoError(t, cli.err)
	akA, akB := vtpmtest.AKID(t, a.issuer.AKPublic()), vtpmtest.AKID(t, b.issuer.AKPublic())
	assert.NotEqual(t, akA, akB)
	assert.Equal(t, akB, srv.conn.Peer().SignerID)
	assert.Equal(t, akA, cli.conn.Peer().SignerID)
}

// TestMutualLargeEvidence: in mutual attestation both sides send their evidence at once.
// Evidence larger than the socket buffers hold (48 MiB, more than Linux's loopback buffers
// grow to: 4 MiB to send, 32 MiB to receive by default) needs each side to read the other's
// while its own is still being written; written inline, both writes would wait for a reader
// until the deadline, and the handshake would fail.
func TestMutualLargeEvidence(t *testing.T) {
	const size = 48 << 20
	big := issuerFunc{variant.QEMUVTPM, func(context.Context, attestation.Purpose, []byte) ([]byte, error) {
		return bytes.Repeat([]byte{0xa5}, size), nil
	}}
	var seen [2]chan []byte
	cfgs := [2]atls.Config{}
	for i := range cfgs {
		seen[i] = make(chan []byte, 1)
		cfgs[i] = atls.Config{Issuer: big, Validators: []attestation.Validator{acceptAnything{variant.QEMUVTPM, seen[i]}}, MaxEvidenceSize: size}
	}
	srv, cli := connect(t, creds(t, cfgs[0]), creds(t, cfgs[1]))
	require.NoError(t, srv.err, "a deadlock ends at the handshake deadline")
	require.NoError(t, cli.err)
	for i := range seen {
		assert.Len(t, <-seen[i], size)
	}
}

// issuerFunc lets a test play a malicious or broken peer.
type issuerFunc struct {
	v  variant.Variant
	fn func(ctx context.Context, purpose attestation.Purpose, data []byte) ([]byte, error)
}

func (i issuerFunc) Variant() variant.Variant { return i.v }
func (i issuerFunc) Issue(ctx context.Context, purpose attestation.Purpose, data []byte) ([]byte, error) {
	return i.fn(ctx, purpose, data)
}

func mutateEvidence(t testing.TB, iss attestation.Issuer, fn func(*vtpmpb.Evidence)) attestation.Issuer {
	return issuerFunc{iss.Variant(), func(ctx context.Context, purpose attestation.Purpose, data []byte) ([]byte, error) {
		ev, err := iss.Issue(ctx, purpose, data)
		if err != nil {
			return nil, err
		}
		e := &vtpmpb.Evidence{}
		require.NoError(t, proto.Unmarshal(ev, e))
		fn(e)
		return proto.Marshal(e)
	}}
}

// TestRejected: a server that requires client attestation rejects each bad client, names the
// reason, and the client learns why.
func TestRejected(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))

	// Evidence recorded from an earlier, genuine connection.
	var mu sync.Mutex
	var recorded []byte
	recorder := issuerFunc{n.issuer.Variant(), func(ctx context.Context, purpose attestation.Purpose, data []byte) ([]byte, error) {
		ev, err := n.issuer.Issue(ctx, purpose, data)
		mu.Lock()
		recorded = ev
		mu.Unlock()
		return ev, err
	}}
	srv, cli := connect(t, creds(t, atls.Config{Validators: []attestation.Validator{n.validator(t)}}), creds(t, atls.Config{Issuer: recorder}))
	require.NoError(t, srv.err)
	require.NoError(t, cli.err)

	otherVariant, err := vtpm.NewIssuer(n.tpm, vtpm.IssuerConfig{Variant: variant.AWSNitroTPM})
	require.NoError(t, err)
	ca, err := vtpmtest.NewPlatformCA("AK CA")
	require.NoError(t, err)
	withRoots, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image-v1", Measurements: n.ref}}}, AKRoots: ca.Pool()})
	require.NoError(t, err)
	wrongRef := measurements.M{}
	for k, v := range n.ref {
		wrongRef[k] = v
	}
	wrongRef[4] = measurements.Measurement{Expected: bytes.Repeat([]byte{0xab}, 32)}
	wrongMeasurements, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image-v2", Measurements: wrongRef}}}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)

	testCases := map[string]struct {
		clientIssuer attestation.Issuer
		validator    attestation.Validator
		wantErr      error
		wantReason   string
		wantMsg      string
	}{
		"wrong nonce": {
			clientIssuer: issuerFunc{variant.QEMUVTPM, func(ctx context.Context, purpose attestation.Purpose, _ []byte) ([]byte, error) {
				return n.issuer.Issue(ctx, purpose, bytes.Repeat([]byte{7}, 32))
			}},
			wantErr: attestation.ErrNonceMismatch, wantReason: "nonce-mismatch",
		},
		// The confused deputy: the client has a genuine node's verification service (which
		// quotes any caller nonce) sign this connection's exporter. The evidence is the
		// node's, fresh and over the right bytes, but made for another purpose.
		"evidence of the verification service over this connection's exporter": {
			clientIssuer: issuerFunc{variant.QEMUVTPM, func(ctx context.Context, _ attestation.Purpose, exporter []byte) ([]byte, error) {
				return n.issuer.Issue(ctx, attestation.PurposeVerify, exporter)
			}},
			wantErr: attestation.ErrNonceMismatch, wantReason: "nonce-mismatch", wantMsg: "another purpose",
		},
		// Reflection: evidence made for the server role presented by the client.
		"evidence for the other role": {
			clientIssuer: issuerFunc{variant.QEMUVTPM, func(ctx context.Context, _ attestation.Purpose, exporter []byte) ([]byte, error) {
				return n.issuer.Issue(ctx, attestation.PurposeATLSServer, exporter)
			}},
			wantErr: attestation.ErrNonceMismatch, wantReason: "nonce-mismatch",
		},
		"evidence replayed on a new connection": {
			clientIssuer: issuerFunc{variant.QEMUVTPM, func(context.Context, attestation.Purpose, []byte) ([]byte, error) {
				mu.Lock()
				defer mu.Unlock()
				return recorded, nil
			}},
			wantErr: attestation.ErrNonceMismatch, wantReason: "nonce-mismatch",
		},
		"tampered quote": {
			clientIssuer: mutateEvidence(t, n.issuer, func(e *vtpmpb.Evidence) { e.Quote[len(e.Quote)-1] ^= 1 }),
			wantErr:      attestation.ErrBadSignature, wantReason: "bad-signature",
		},
		"tampered signature": {
			clientIssuer: mutateEvidence(t, n.issuer, func(e *vtpmpb.Evidence) { e.Signature[50] ^= 1 }),
			wantErr:      attestation.ErrBadSignature, wantReason: "bad-signature",
		},
		"enforced PCR mismatch": {
			clientIssuer: n.issuer, validator: wrongMeasurements,
			wantErr: attestation.ErrMeasurementPolicy, wantReason: "measurement-mismatch",
			wantMsg: `closest is "image-v2" with 1 mismatching register(s): PCR 4: expected abab`,
		},
		"untrusted AK with CA configured": {
			clientIssuer: n.issuer, validator: withRoots,
			wantErr: attestation.ErrUntrustedSigner, wantReason: "untrusted-signer", wantMsg: "no AK certificate",
		},
		"peer offers another variant": {
			clientIssuer: otherVariant,
			wantReason:   "incompatible", wantMsg: `no compatible evidence: peer offers "aws-nitro-tpm"; we accept [qemu-vtpm]`,
		},
		"evidence of another variant under a qemu-vtpm hello": {
			clientIssuer: issuerFunc{variant.QEMUVTPM, otherVariant.Issue},
			wantErr:      attestation.ErrWrongVariant, wantReason: "wrong-variant",
		},
		"oversized evidence": {
			clientIssuer: issuerFunc{variant.QEMUVTPM, func(context.Context, attestation.Purpose, []byte) ([]byte, error) {
				return make([]byte, attestation.DefaultMaxEvidenceSize+frameSlack), nil
			}},
			wantErr: attestation.ErrTooLarge, wantReason: "too-large",
		},
		"garbage evidence": {
			clientIssuer: issuerFunc{variant.QEMUVTPM, func(context.Context, attestation.Purpose, []byte) ([]byte, error) {
				return []byte("\x0a\xff\xff garbage"), nil
			}},
			wantErr: attestation.ErrMalformed, wantReason: "malformed",
		},
		"client does not attest": {
			clientIssuer: nil,
			wantReason:   "incompatible", wantMsg: "peer does not attest; we require one of [qemu-vtpm]",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			validator := tc.validator
			if validator == nil {
				validator = n.validator(t)
			}
			clientCfg := atls.Config{Issuer: tc.clientIssuer}
			if tc.clientIssuer == nil {
				// A client that attests nothing but wants the server's evidence.
				clientCfg = atls.Config{Validators: []attestation.Validator{n.validator(t)}}
			}
			srv, cli := connect(t, creds(t, atls.Config{Validators: []attestation.Validator{validator}}), creds(t, clientCfg))
			require.Error(t, srv.err)
			require.Error(t, cli.err, "the client must not believe it is connected")
			assert.Nil(t, srv.conn)

			var e *atls.Error
			require.True(t, errors.As(srv.err, &e), "%v", srv.err)
			assert.True(t, e.Local)
			assert.Equal(t, tc.wantReason, e.Reason)
			if tc.wantErr != nil {
				assert.ErrorIs(t, srv.err, tc.wantErr)
			}
			if tc.wantMsg != "" {
				assert.ErrorContains(t, srv.err, tc.wantMsg)
			}
			// The client is told why, not left with a reset: by the server's Abort, or, when
			// no common variant exists, by its own check of the server's Hello.
			if tc.wantReason == "incompatible" {
				assert.ErrorContains(t, cli.err, "no compatible evidence")
			} else if tc.wantMsg != "" {
				assert.ErrorContains(t, cli.err, "peer aborted: ")
				assert.ErrorContains(t, cli.err, tc.wantMsg)
			}
			// The Abort carries the server's reason label: the client learns why it was
			// refused as a label, not only as text (what the join service publishes of a node
			// that refused it, docs/atls.md "Errors").
			var ce *atls.Error
			if errors.As(cli.err, &ce) && !ce.Local {
				assert.Equal(t, tc.wantReason, ce.PeerReason, "%v", cli.err)
			}
		})
	}
}

// A node that refuses the join service's evidence aborts with its reason label; the service
// sees that the peer aborted (Local false, Reason "peer-abort") and which label it gave.
func TestAbortCarriesTheReasonLabel(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	wrongRef := measurements.M{}
	for k, v := range n.ref {
		wrongRef[k] = v
	}
	wrongRef[4] = measurements.Measurement{Expected: bytes.Repeat([]byte{0xab}, 32)}
	nodeCheck, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{
		ReferenceSets: measurements.ReferenceSets{{Name: "this node's image", Measurements: wrongRef}}, Log: slog.New(slog.DiscardHandler),
	}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)
	service := creds(t, atls.Config{Issuer: n.issuer, Validators: []attestation.Validator{n.validator(t)}})
	node := creds(t, atls.Config{Issuer: n.issuer, Validators: []attestation.Validator{nodeCheck}})
	srv, cli := connect(t, service, node)

	var e *atls.Error
	require.ErrorAs(t, cli.err, &e)
	assert.True(t, e.Local, "the node refused")
	assert.Equal(t, "measurement-mismatch", e.Reason)
	require.ErrorAs(t, srv.err, &e)
	assert.False(t, e.Local, "the service was refused")
	assert.Equal(t, atls.ReasonPeerAbort, e.Reason)
	assert.Equal(t, "measurement-mismatch", e.PeerReason)
	assert.ErrorContains(t, srv.err, "peer aborted: measurements do not match")
}

// A refused peer costs the server neither a quote nor a verification, and is told why.
func TestAdmitRefusesBeforeAttestation(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	var issued, validated atomic.Int32
	countingIssuer := issuerFunc{n.issuer.Variant(), func(ctx context.Context, purpose attestation.Purpose, data []byte) ([]byte, error) {
		issued.Add(1)
		return n.issuer.Issue(ctx, purpose, data)
	}}
	var seenRemote net.Addr
	server := creds(t, atls.Config{
		Issuer:     countingIssuer,
		Validators: []attestation.Validator{countingValidator{n.validator(t), &validated}},
		Admit: func(_ context.Context, remote net.Addr) (func(), error) {
			seenRemote = remote
			return nil, errors.New("rate limit exceeded for this peer, retry later")
		},
	})
	client := creds(t, atls.Config{Issuer: n.issuer, Validators: []attestation.Validator{n.validator(t)}})

	srv, cli := connect(t, server, client)
	var e *atls.Error
	require.ErrorAs(t, srv.err, &e)
	assert.True(t, e.Local)
	assert.Equal(t, "refused", e.Reason)
	require.ErrorAs(t, cli.err, &e)
	assert.False(t, e.Local)
	assert.ErrorContains(t, cli.err, "peer aborted: rate limit exceeded for this peer, retry later")
	assert.Zero(t, issued.Load(), "server issued evidence for a refused peer")
	assert.Zero(t, validated.Load(), "server validated evidence of a refused peer")
	require.NotNil(t, seenRemote)
	assert.Contains(t, seenRemote.String(), "127.0.0.1:")
}

// An admitted handshake holds its admission until the attested handshake ends, successful or
// not, and releases it exactly once; the established connection holds nothing.
func TestAdmitReleasesWhenHandshakeEnds(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	var admitted, released atomic.Int32
	server := creds(t, atls.Config{
		Issuer: n.issuer,
		Admit: func(context.Context, net.Addr) (func(), error) {
			admitted.Add(1)
			return func() { released.Add(1) }, nil
		},
	})
	srv, cli := connect(t, server, creds(t, atls.Config{Validators: []attestation.Validator{n.validator(t)}}))
	require.NoError(t, srv.err)
	require.NoError(t, cli.err)
	assert.Equal(t, int32(1), admitted.Load())
	assert.Equal(t, int32(1), released.Load(), "released while the connection stays open")

	other := &node{ref: measurements.M{}}
	for k, v := range n.ref {
		other.ref[k] = v
	}
	other.ref[4] = measurements.Measurement{Expected: bytes.Repeat([]byte{1}, 32)}
	srv, cli = connect(t, server, creds(t, atls.Config{Validators: []attestation.Validator{other.validator(t)}}))
	require.Error(t, cli.err)
	require.Error(t, srv.err)
	assert.Equal(t, int32(2), admitted.Load())
	assert.Equal(t, int32(2), released.Load(), "released after a failed handshake")
}

type countingValidator struct {
	attestation.Validator
	n *atomic.Int32
}

func (v countingValidator) Validate(ctx context.Context, evidence []byte, purpose attestation.Purpose, data []byte) (*attestation.Verified, error) {
	v.n.Add(1)
	return v.Validator.Validate(ctx, evidence, purpose, data)
}

// frameSlack pushes evidence past the default limit even with frame overhead.
const frameSlack = 4096

// rawPeer connects with a TLS client that speaks the right ALPN but then sends bytes of its
// choosing, as an attacker would.
func rawPeer(t *testing.T, server *atls.Credentials, alpn []string, send func(c *tls.Conn)) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	errCh := make(chan error, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			errCh <- err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = server.Server(ctx, raw)
		errCh <- err
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: alpn, MinVersion: tls.VersionTLS13})
	if err == nil {
		send(c)
		t.Cleanup(func() { c.Close() })
	}
	return <-errCh
}

func TestMalformedFrames(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	server := creds(t, atls.Config{Validators: []attestation.Validator{n.validator(t)}})
	frame := func(payload []byte) []byte {
		return binary.BigEndian.AppendUint32(nil, uint32(len(payload))) // header only
	}
	testCases := map[string]struct {
		alpn    []string
		send    func(c *tls.Conn)
		wantMsg string
	}{
		"plain TLS client without ALPN": {
			send:    func(*tls.Conn) {},
			wantMsg: "peer does not speak constellation-atls/1",
		},
		"garbage instead of a frame": {
			alpn:    []string{atls.ALPN},
			send:    func(c *tls.Conn) { _, _ = c.Write([]byte{0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0xff}) },
			wantMsg: "malformed frame",
		},
		"truncated frame then close": {
			alpn: []string{atls.ALPN},
			send: func(c *tls.Conn) {
				_, _ = c.Write(append(frame(make([]byte, 100)), 1, 2, 3))
				c.Close()
			},
			wantMsg: "reading frame",
		},
		"hello frame too large": {
			alpn:    []string{atls.ALPN},
			send:    func(c *tls.Conn) { _, _ = c.Write(binary.BigEndian.AppendUint32(nil, 1<<30)) },
			wantMsg: "frame too large",
		},
		"empty frame": {
			alpn:    []string{atls.ALPN},
			send:    func(c *tls.Conn) { _, _ = c.Write([]byte{0, 0, 0, 0}) },
			wantMsg: "malformed frame: empty",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			err := rawPeer(t, server, tc.alpn, tc.send)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.wantMsg)
			var e *atls.Error
			assert.True(t, errors.As(err, &e), "every failure is an *atls.Error: %v", err)
		})
	}
}

func TestGRPC(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	seen := make(chan *attestation.Verified, 4)
	srv := grpc.NewServer(
		grpc.Creds(creds(t, atls.Config{Validators: []attestation.Validator{n.validator(t)}})),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			peer, ok := atls.PeerFromContext(ctx)
			if !ok {
				return nil, status.Error(codes.Unauthenticated, "no attested peer")
			}
			seen <- peer
			return handler(ctx, req)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	call := func(iss attestation.Issuer) error {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(creds(t, atls.Config{Issuer: iss})))
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}

	require.NoError(t, call(n.issuer))
	peer := <-seen
	assert.Equal(t, "image-v1", peer.ReferenceSet)

	err = call(mutateEvidence(t, n.issuer, func(e *vtpmpb.Evidence) { e.Signature[50] ^= 1 }))
	require.Error(t, err)
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Contains(t, err.Error(), "evidence signature invalid")
}

func FuzzReadFrames(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, 0x0a, 0x00})
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		atls.DecodeFramesForFuzzing(data)
	})
}

// acceptAnything is a man in the middle's validator: it takes whatever evidence the victim
// sends and hands it to the relay.
type acceptAnything struct {
	v        variant.Variant
	evidence chan<- []byte
}

func (a acceptAnything) Variant() variant.Variant { return a.v }
func (a acceptAnything) Validate(_ context.Context, evidence []byte, _ attestation.Purpose, _ []byte) (*attestation.Verified, error) {
	a.evidence <- evidence
	return &attestation.Verified{Variant: a.v}, nil
}

// TestManInTheMiddle: an attacker terminates TLS towards a genuine node (which attests to
// it) and towards the server, and relays the genuine node's fresh evidence live. The server
// refuses it: the evidence binds the exporter of the victim's connection, not of the
// attacker's connection to the server.
func TestManInTheMiddle(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	relayed := make(chan []byte, 1)
	// Towards the genuine node, the attacker is a server that requires attestation.
	towardsVictim := creds(t, atls.Config{Validators: []attestation.Validator{acceptAnything{n.issuer.Variant(), relayed}}})
	// Towards the real server, the attacker presents what the victim sent.
	towardsServer := creds(t, atls.Config{Issuer: issuerFunc{n.issuer.Variant(), func(ctx context.Context, _ attestation.Purpose, _ []byte) ([]byte, error) {
		select {
		case ev := <-relayed:
			return ev, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}}})
	server := creds(t, atls.Config{Validators: []attestation.Validator{n.validator(t)}})
	victim := creds(t, atls.Config{Issuer: n.issuer})

	victimDone := make(chan result, 1)
	go func() {
		_, cli := connect(t, towardsVictim, victim)
		victimDone <- cli
	}()
	srv, _ := connect(t, server, towardsServer)
	require.NoError(t, (<-victimDone).err, "the victim attested to the attacker")
	require.ErrorIs(t, srv.err, attestation.ErrNonceMismatch)
	var e *atls.Error
	require.ErrorAs(t, srv.err, &e)
	assert.Equal(t, "nonce-mismatch", e.Reason)
}

// hostileText is what a peer sends to act on the operator's terminal: clear the screen, set
// the window title (OSC, ended by BEL), return to the line's start and forge a log line.
const hostileText = "\x1b[2J\x1b]0;pwned\x07\r\nlevel=ERROR msg=forged "

// hostile returns about n bytes of hostileText.
func hostile(n int) string {
	return strings.Repeat(hostileText, n/len(hostileText)+1)[:n]
}

// assertSafeLine fails unless msg is at most 1 KiB and carries nothing a terminal acts on.
func assertSafeLine(t *testing.T, msg string) {
	t.Helper()
	assert.LessOrEqual(t, len(msg), 1<<10, "a peer's text is bounded")
	for _, c := range []string{"\x1b", "\x07", "\r", "\n"} {
		assert.NotContains(t, msg, c, "a peer's text reaches the terminal escaped")
	}
}

// hostilePeer is an attacker's side of the protocol: a TLS endpoint that speaks the ALPN and
// then sends the frames it likes, whatever the other side says. It returns the victim's end
// of the connection.
func hostilePeer(t *testing.T, server bool, frames ...*atlspb.Frame) net.Conn {
	t.Helper()
	cert, err := atls.EphemeralCert()
	require.NoError(t, err)
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	go sendFrames(a, server, cert, frames)
	return b
}

// sendFrames runs the attacker's side on raw: TLS in the given role, then frames, then it
// reads until the victim closes.
func sendFrames(raw net.Conn, server bool, cert tls.Certificate, frames []*atlspb.Frame) {
	defer raw.Close()
	var c *tls.Conn
	if server {
		c = tls.Server(raw, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{atls.ALPN}, MinVersion: tls.VersionTLS13})
	} else {
		c = tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{atls.ALPN}, MinVersion: tls.VersionTLS13})
	}
	// Drain what the victim sends (its Hello, its Abort), so it never blocks on writing, until
	// it hangs up.
	hungUp := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, c)
		close(hungUp)
	}()
	for _, f := range frames {
		payload, err := proto.Marshal(f)
		if err != nil {
			return
		}
		if _, err := c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)); err != nil {
			return
		}
	}
	<-hungUp
}

// TestHostilePeerText: a peer controls the text of its Abort (up to the evidence limit while
// evidence is awaited: 256 KiB), the variant names of its Hello and Evidence. Whatever it
// sends, the error the other side returns, logs and prints is one line of at most 1 KiB
// without escape sequences, bell, carriage return or line feed; directly and through gRPC.
func TestHostilePeerText(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	hello := func(issuer string, accepted ...string) *atlspb.Frame {
		return &atlspb.Frame{Kind: &atlspb.Frame_Hello{Hello: &atlspb.Hello{Version: 1, IssuerVariant: issuer, AcceptedVariants: accepted}}}
	}
	abort := func(reason string) *atlspb.Frame {
		return &atlspb.Frame{Kind: &atlspb.Frame_Abort{Abort: &atlspb.Abort{Reason: reason}}}
	}
	labelled := func(label string) *atlspb.Frame {
		return &atlspb.Frame{Kind: &atlspb.Frame_Abort{Abort: &atlspb.Abort{Reason: "refused", Label: label}}}
	}
	evidence := func(v string) *atlspb.Frame {
		return &atlspb.Frame{Kind: &atlspb.Frame_Evidence{Evidence: &atlspb.Evidence{Variant: v, Evidence: []byte("x")}}}
	}
	manyNames := make([]string, 1000)
	for i := range manyNames {
		manyNames[i] = hostile(1)
	}
	// The victims are built as the binaries build them: the CLI verifying a node (client with
	// a qemu-vtpm validator), the join service admitting one (server with a validator), a
	// node attesting to the join service (client with an issuer).
	cli := creds(t, atls.Config{Validators: []attestation.Validator{n.validator(t)}})
	joinService := creds(t, atls.Config{Validators: []attestation.Validator{n.validator(t)}})
	node := creds(t, atls.Config{Issuer: n.issuer})

	testCases := map[string]struct {
		victim     *atls.Credentials
		victimRole atls.Role
		frames     []*atlspb.Frame
		wantReason string
		wantLocal  bool
		wantMsg    string
		// wantPeerReason is the label the victim keeps of the peer's Abort.
		wantPeerReason string
	}{
		"server aborts with 256 KiB while the CLI awaits evidence": {
			victim: cli, victimRole: atls.RoleClient,
			frames:     []*atlspb.Frame{hello("qemu-vtpm"), abort(hostile(attestation.DefaultMaxEvidenceSize))},
			wantReason: "peer-abort", wantMsg: `peer aborted: \x1b[2J\x1b]0;pwned\a\r\nlevel=ERROR msg=forged`,
		},
		"client aborts with 256 KiB while the join service awaits evidence": {
			victim: joinService, victimRole: atls.RoleServer,
			frames:     []*atlspb.Frame{hello("qemu-vtpm"), abort(hostile(attestation.DefaultMaxEvidenceSize))},
			wantReason: "peer-abort", wantMsg: `bytes)`,
		},
		"service aborts in its Hello's place": {
			victim: node, victimRole: atls.RoleClient,
			frames:     []*atlspb.Frame{abort(hostile(3 << 10))},
			wantReason: "peer-abort",
		},
		"service aborts instead of a Verdict": {
			victim: node, victimRole: atls.RoleClient,
			frames:     []*atlspb.Frame{hello("", "qemu-vtpm"), abort(hostile(3 << 10))},
			wantReason: "peer-abort",
		},
		// The label is the peer's word too: kept only when it is one of the labels this side
		// knows, so what reaches a log or the CLI is one of a closed set.
		"client aborts with a hostile label": {
			victim: joinService, victimRole: atls.RoleServer,
			frames:     []*atlspb.Frame{hello("qemu-vtpm"), labelled(hostile(3 << 10))},
			wantReason: "peer-abort",
		},
		"client aborts with a label that is no reason": {
			victim: joinService, victimRole: atls.RoleServer,
			frames:     []*atlspb.Frame{hello("qemu-vtpm"), labelled("peer-abort")},
			wantReason: "peer-abort",
		},
		"client aborts with a known label": {
			victim: joinService, victimRole: atls.RoleServer,
			frames:     []*atlspb.Frame{hello("qemu-vtpm"), labelled("measurement-mismatch")},
			wantReason: "peer-abort", wantPeerReason: "measurement-mismatch",
		},
		"server offers a hostile variant": {
			victim: cli, victimRole: atls.RoleClient,
			frames:     []*atlspb.Frame{hello(hostile(3 << 10))},
			wantReason: "incompatible", wantLocal: true, wantMsg: `peer offers "\x1b[2J`,
		},
		"service accepts 1000 hostile variants": {
			victim: node, victimRole: atls.RoleClient,
			frames:     []*atlspb.Frame{hello("", manyNames...)},
			wantReason: "incompatible", wantLocal: true, wantMsg: "more)]",
		},
		"evidence names a hostile variant": {
			victim: cli, victimRole: atls.RoleClient,
			frames:     []*atlspb.Frame{hello("qemu-vtpm"), evidence(hostile(200 << 10))},
			wantReason: "wrong-variant", wantLocal: true, wantMsg: `sent "\x1b[2J`,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			raw := hostilePeer(t, tc.victimRole == atls.RoleClient, tc.frames...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			if tc.victimRole == atls.RoleClient {
				_, err = tc.victim.Client(ctx, raw)
			} else {
				_, err = tc.victim.Server(ctx, raw)
			}
			require.Error(t, err)
			var e *atls.Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, tc.wantReason, e.Reason, "%v", err)
			assert.Equal(t, tc.wantLocal, e.Local)
			assert.Equal(t, tc.wantPeerReason, e.PeerReason)
			assertSafeLine(t, err.Error())
			assert.Contains(t, err.Error(), tc.wantMsg)
		})
	}

	// Through gRPC, as the CLI, the join client and recover call: the handshake's error is
	// the message of an Unavailable status.
	t.Run("through gRPC", func(t *testing.T) {
		cert, err := atls.EphemeralCert()
		require.NoError(t, err)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		var wg sync.WaitGroup
		t.Cleanup(func() { ln.Close(); wg.Wait() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					sendFrames(c, true, cert, []*atlspb.Frame{hello("qemu-vtpm"), abort(hostile(attestation.DefaultMaxEvidenceSize))})
				}()
			}
		}()
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(cli))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		require.Error(t, err)
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Contains(t, err.Error(), "peer aborted")
		assertSafeLine(t, err.Error())
	})
}

// The reason this side sends is cut to fit the smallest frame the peer reads: a long
// rejection (many mismatching registers) reaches a node that waits for its Verdict as the
// reason, not as "frame too large".
func TestLongAbortReasonReachesThePeer(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	server := creds(t, atls.Config{
		Validators: []attestation.Validator{n.validator(t)},
		Admit: func(context.Context, net.Addr) (func(), error) {
			return nil, errors.New("refused: " + strings.Repeat("every register listed; ", 400))
		},
	})
	srv, cli := connect(t, server, creds(t, atls.Config{Issuer: n.issuer}))
	require.Error(t, srv.err)
	assert.Greater(t, len(srv.err.Error()), 8<<10, "this side keeps its whole reason")
	var e *atls.Error
	require.ErrorAs(t, cli.err, &e)
	assert.Equal(t, "peer-abort", e.Reason, "%v", cli.err)
	assert.Contains(t, cli.err.Error(), "peer aborted: refused: every register listed")
}

// A peer that finishes the attested handshake with a gRPC server and then sends nothing (no
// HTTP/2 preface) is cut off at the handshake deadline: the deadline stays on the connection
// until gRPC's transport is up. Cleared after the attested handshake, it would leave the
// connection, its goroutine and gRPC's buffers held forever (gRPC's own connection timeout
// is overwritten by the handshake's deadline).
func TestGRPCServerBoundsTheHTTP2Preface(t *testing.T) {
	n := bootNode(t, vtpmtest.Simulator(t))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(creds(t, atls.Config{Issuer: n.issuer, HandshakeTimeout: time.Second})))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	client := creds(t, atls.Config{Validators: []attestation.Validator{n.validator(t)}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, "tcp", ln.Addr().String())
	require.NoError(t, err, "the attested handshake succeeds")
	t.Cleanup(func() { conn.Close() })
	// The server's HTTP/2 settings arrive; then the server waits for a preface that never
	// comes, until the deadline.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err = io.Copy(io.Discard, conn)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server closed the connection before our 30 s: %v", err)
}
