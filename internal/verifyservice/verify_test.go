package verifyservice_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/verifyservice"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/api/verify/verifypb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
	"github.com/openconstellation/constellation/pkg/verify"
)

// image is what the test nodes boot.
var image = []softfirmware.Component{
	softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("bootstrapper v1")),
	softfirmware.BytesComponent("node config", local.PCRNodeConfig, []byte("node config v1")),
}

var (
	clusterID      = bytes.Repeat([]byte{0xc1}, 32)
	otherClusterID = bytes.Repeat([]byte{0x0c}, 32)
)

// nodeOptions describe how a test node deviates from a genuine initialized node.
type nodeOptions struct {
	marker []byte // cluster ID extended into PCR 15; nil: not initialized
	// loaded is an extra component measured after boot, e.g. an unexpected bootstrapper.
	loaded *softfirmware.Component
	// name is the node name the provider certifies the AK for ("worker-0" when empty).
	name string
}

// node is a verification service on a real swtpm: booted from image (measured as the
// provider does), AKs certified by the provider's CA, PCR 15 marked.
type node struct {
	grpcAddr string
	httpURL  string
	server   *verifyservice.Server
}

func startNode(t *testing.T, ca *akca.CA, opts nodeOptions) *node {
	t.Helper()
	ctx := context.Background()
	proc := vtpmtest.SwtpmProcess(t)
	tpm, err := proc.Open(ctx)
	require.NoError(t, err)
	boot := image
	if opts.loaded != nil {
		boot = append(slices.Clone(image), *opts.loaded)
	}
	bootLog, err := softfirmware.MeasureLogged(tpm, boot)
	require.NoError(t, err)
	name := opts.name
	if name == "" {
		name = "worker-0"
	}
	require.NoError(t, softfirmware.CertifyAK(tpm, ca, name, metadata.Worker, time.Now()))
	if opts.marker != nil {
		digest := sha256.Sum256(opts.marker)
		require.NoError(t, tpm.ExtendPCR(int(markerRegister), digest[:]))
	}
	// The service opens the TPM per request: release this connection.
	require.NoError(t, tpm.Close())

	iss, err := vtpm.NewPerUseIssuer(ctx, vtpm.OpenAddr(proc.Addr()), qemu.VTPMIssuerConfig(qemu.IssuerConfig{
		AK: vtpm.AKRSA, EventLog: func() ([]byte, error) { return bootLog, nil },
	}))
	require.NoError(t, err)
	srv, err := verifyservice.New(verifyservice.Config{Issuer: iss})
	require.NoError(t, err)
	return &node{grpcAddr: serveGRPC(t, srv), httpURL: serveHTTP(t, srv), server: srv}
}

// serveGRPC serves srv's gRPC service as cmd/verificationservice does.
func serveGRPC(t *testing.T, srv *verifyservice.Server) string {
	t.Helper()
	return serve(t, cmdutil.GRPC("grpc", "", srv.NewGRPCServer()))
}

// serveHTTP serves srv's HTTP endpoint as cmd/verificationservice does; it returns the base URL.
func serveHTTP(t *testing.T, srv *verifyservice.Server) string {
	t.Helper()
	return "http://" + serve(t, cmdutil.HTTP("http", "", srv, srv.HTTPAcceptLimiter()))
}

func serve(t *testing.T, s cmdutil.Server) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.Stop(ctx)
		<-done
	})
	return ln.Addr().String()
}

// servePlainGRPC serves a gRPC service that is not the verification service (a proxy).
func servePlainGRPC(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	g := grpc.NewServer()
	register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

// validator is the CLI's: the image's reference values, AKs certified by ca.
func validator(t *testing.T, ca *akca.CA) attestation.Validator {
	t.Helper()
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image-v1", Measurements: softfirmware.ExpectedPCRs(image)}}},
		AKRoots:         ca.Pool(),
	})
	require.NoError(t, err)
	return v
}

func newCA(t *testing.T, name string) *akca.CA {
	t.Helper()
	ca, err := akca.New(name, time.Now(), time.Hour)
	require.NoError(t, err)
	return ca
}

// proxy is a man in the middle between the CLI and a genuine node's service.
type proxy struct {
	verifypb.UnimplementedVerificationServiceServer
	upstream verifypb.VerificationServiceClient
	mutate   func(t *testing.T, req *verifypb.GetAttestationRequest, resp *verifypb.GetAttestationResponse)
	t        *testing.T
}

func (p *proxy) GetAttestation(ctx context.Context, req *verifypb.GetAttestationRequest) (*verifypb.GetAttestationResponse, error) {
	fwd := proto.Clone(req).(*verifypb.GetAttestationRequest)
	if p.mutate != nil {
		p.mutate(p.t, fwd, nil)
	}
	resp, err := p.upstream.GetAttestation(ctx, fwd)
	if err != nil {
		return nil, err
	}
	if p.mutate != nil {
		p.mutate(p.t, nil, resp)
	}
	return resp, nil
}

func startProxy(t *testing.T, upstream string, mutate func(*testing.T, *verifypb.GetAttestationRequest, *verifypb.GetAttestationResponse)) string {
	t.Helper()
	conn, err := grpc.NewClient(upstream, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	p := &proxy{upstream: verifypb.NewVerificationServiceClient(conn), mutate: mutate, t: t}
	return servePlainGRPC(t, func(g *grpc.Server) { verifypb.RegisterVerificationServiceServer(g, p) })
}

// editEvidence changes the evidence in a response.
func editEvidence(fn func(*vtpmpb.Evidence)) func(*testing.T, *verifypb.GetAttestationRequest, *verifypb.GetAttestationResponse) {
	return func(t *testing.T, _ *verifypb.GetAttestationRequest, resp *verifypb.GetAttestationResponse) {
		if resp == nil {
			return
		}
		ev := &vtpmpb.Evidence{}
		require.NoError(t, proto.Unmarshal(resp.Evidence, ev))
		fn(ev)
		var err error
		resp.Evidence, err = proto.Marshal(ev)
		require.NoError(t, err)
	}
}

func TestVerify(t *testing.T) {
	ca := newCA(t, "local AK CA")
	otherCA := newCA(t, "another provider's AK CA")
	genuine := startNode(t, ca, nodeOptions{marker: clusterID})
	unexpected := softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("a debug bootstrapper"))

	testCases := map[string]struct {
		node      *nodeOptions // nil: the genuine node
		proxy     func(*testing.T, *verifypb.GetAttestationRequest, *verifypb.GetAttestationResponse)
		roots     *akca.CA // nil: ca
		clusterID []byte   // nil: clusterID
		wantErr   error
		wantMsg   []string
		// wantResult: the evidence verified, so a result comes back even with an error.
		wantResult bool
		wantSigner string // "worker-0" when empty
	}{
		"genuine node of this cluster": {wantResult: true},
		"node loaded an unexpected component": {
			node:    &nodeOptions{marker: clusterID, loaded: &unexpected},
			wantErr: attestation.ErrMeasurementPolicy,
			wantMsg: []string{fmt.Sprintf("PCR %d: expected", local.PCRBootstrapper), `closest is "image-v1"`},
		},
		"PCR value altered in transit": {
			proxy:   editEvidence(func(e *vtpmpb.Evidence) { e.Pcrs[local.PCRNodeConfig][0] ^= 1 }),
			wantErr: attestation.ErrBadSignature,
		},
		"PCR 15 rewritten in transit to this cluster's marker": {
			node:    &nodeOptions{marker: otherClusterID},
			proxy:   editEvidence(func(e *vtpmpb.Evidence) { e.Pcrs[markerRegister] = variant.QEMUVTPM.ClusterIDMarker(clusterID) }),
			wantErr: attestation.ErrBadSignature,
		},
		"evidence for another nonce (replayed)": {
			proxy: func(_ *testing.T, req *verifypb.GetAttestationRequest, _ *verifypb.GetAttestationResponse) {
				if req != nil {
					req.Nonce = bytes.Repeat([]byte{0xee}, 32)
				}
			},
			wantErr: attestation.ErrNonceMismatch,
		},
		"AK not certified by the expected provider": {
			roots:   otherCA,
			wantErr: attestation.ErrUntrustedSigner,
		},
		"service announces another variant": {
			proxy: func(_ *testing.T, _ *verifypb.GetAttestationRequest, resp *verifypb.GetAttestationResponse) {
				if resp != nil {
					resp.Variant = variant.AzureSEVSNP.String()
				}
			},
			wantErr: attestation.ErrWrongVariant,
			wantMsg: []string{`node attests with variant "azure-sev-snp", expected "qemu-vtpm"`},
		},
		// worker-0's address answers with worker-1's evidence (worker-0 relays to a
		// genuine node of the same cluster and image): fresh, certified, this cluster's
		// marker, and still not worker-0's.
		"another node's evidence relayed": {
			node:       &nodeOptions{marker: clusterID, name: "worker-1"},
			wantErr:    verify.ErrWrongNode,
			wantMsg:    []string{`certified for "worker-1", not "worker-0"`, "relay"},
			wantResult: true, wantSigner: "worker-1",
		},
		"node of another cluster": {
			node:       &nodeOptions{marker: otherClusterID},
			wantErr:    verify.ErrClusterIDMismatch,
			wantMsg:    []string{"belongs to another cluster", hex.EncodeToString(variant.QEMUVTPM.ClusterIDMarker(otherClusterID))},
			wantResult: true,
		},
		"expecting another cluster": {
			clusterID:  otherClusterID,
			wantErr:    verify.ErrClusterIDMismatch,
			wantMsg:    []string{"belongs to another cluster"},
			wantResult: true,
		},
		"node not initialized": {
			node:       &nodeOptions{},
			wantErr:    verify.ErrClusterIDMismatch,
			wantMsg:    []string{"not initialized"},
			wantResult: true,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			addr := genuine.grpcAddr
			if tc.node != nil {
				addr = startNode(t, ca, *tc.node).grpcAddr
			}
			if tc.proxy != nil {
				addr = startProxy(t, addr, tc.proxy)
			}
			roots, id := ca, clusterID
			if tc.roots != nil {
				roots = tc.roots
			}
			if tc.clusterID != nil {
				id = tc.clusterID
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := verify.Verify(ctx, "worker-0", addr, validator(t, roots), id)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				assert.ErrorContains(t, err, addr, "the error names the endpoint")
			} else {
				require.NoError(t, err)
			}
			for _, m := range tc.wantMsg {
				assert.ErrorContains(t, err, m)
			}
			if !tc.wantResult {
				assert.Nil(t, res)
				return
			}
			require.NotNil(t, res)
			assert.Equal(t, addr, res.Endpoint)
			assert.Equal(t, "qemu-vtpm", res.Variant)
			assert.Equal(t, "image-v1", res.ReferenceSet)
			assert.Len(t, res.Nonce, 2*verify.NonceSize)
			require.Len(t, res.Registers, vtpm.NumPCRs)
			assert.Equal(t, verify.Register{Index: 15, Name: "PCR 15", Value: res.ClusterID.Actual}, res.Registers[15])
			signer := tc.wantSigner
			if signer == "" {
				signer = "worker-0"
			}
			assert.Equal(t, verify.Signer{ID: res.Signer.ID, Certified: true, Name: signer}, res.Signer)
			assert.Len(t, res.Signer.ID, 64)
			assert.Equal(t, hex.EncodeToString(id), res.ClusterID.ClusterID)
			assert.Equal(t, hex.EncodeToString(variant.QEMUVTPM.ClusterIDMarker(id)), res.ClusterID.Expected)
			assert.Equal(t, "PCR 15", res.ClusterID.Register)
			assert.Equal(t, tc.wantErr == nil || tc.wantErr == verify.ErrWrongNode, res.ClusterID.Match)

			// The result is what `-o json` prints.
			out, err := json.Marshal(res)
			require.NoError(t, err)
			for _, key := range []string{`"endpoint"`, `"referenceSet":"image-v1"`, `"registers"`, `"signer"`, `"clusterID"`, `"match"`} {
				assert.Contains(t, string(out), key)
			}
		})
	}
}

// A verifier without platform roots (it accepted unauthenticated AKs) cannot tie evidence to
// a node: it fails closed, although the evidence itself verifies.
func TestVerifyUncertifiedSigner(t *testing.T) {
	ca := newCA(t, "local AK CA")
	n := startNode(t, ca, nodeOptions{marker: clusterID})
	noRoots, err := qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon:         attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image-v1", Measurements: softfirmware.ExpectedPCRs(image)}}, Log: slog.New(slog.DiscardHandler)},
		AcceptUnauthenticatedAK: true,
	})
	require.NoError(t, err)
	res, err := verify.Verify(context.Background(), "worker-0", n.grpcAddr, noRoots, clusterID)
	require.ErrorIs(t, err, verify.ErrWrongNode)
	assert.ErrorContains(t, err, "carries no platform certificate")
	require.NotNil(t, res)
	assert.False(t, res.Signer.Certified)
}

// A service that accepts connections but never answers: the client gives up with its context.
func TestVerifyTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	ca := newCA(t, "local AK CA")
	start := time.Now()
	_, err = verify.Verifier{Validator: validator(t, ca), ClusterID: clusterID, Timeout: 500 * time.Millisecond}.Verify(context.Background(), "worker-0", ln.Addr().String())
	require.Error(t, err)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(unwrapStatus(err)), "%v", err)
	assert.Less(t, time.Since(start), 5*time.Second)

	_, err = verify.Verify(context.Background(), "worker-0", ln.Addr().String(), nil, clusterID)
	assert.ErrorContains(t, err, "no validator")
	_, err = verify.Verify(context.Background(), "worker-0", ln.Addr().String(), validator(t, ca), nil)
	assert.ErrorContains(t, err, "no cluster ID")
	_, err = verify.Verify(context.Background(), "", ln.Addr().String(), validator(t, ca), clusterID)
	assert.ErrorContains(t, err, "no node name")
}

func unwrapStatus(err error) error {
	for e := err; e != nil; {
		if _, ok := status.FromError(e); ok {
			return e
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return err
}

func TestHTTP(t *testing.T) {
	ca := newCA(t, "local AK CA")
	n := startNode(t, ca, nodeOptions{marker: clusterID})

	t.Run("evidence for the nonce", func(t *testing.T) {
		nonce := bytes.Repeat([]byte{0x5a}, 24)
		resp, err := http.Get(n.httpURL + "/v1/attest?nonce=" + strings.ToUpper(hex.EncodeToString(nonce)))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
		var body verifyservice.HTTPResponse
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		assert.Equal(t, "qemu-vtpm", body.Variant)
		ev, err := base64.StdEncoding.DecodeString(body.Evidence)
		require.NoError(t, err)
		verified, err := validator(t, ca).Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
		require.NoError(t, err)
		assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(clusterID), verified.Registers[markerRegister])
	})

	for name, tc := range map[string]struct {
		method, target string
		code           int
		want           string
	}{
		"no nonce":          {target: "/v1/attest", code: 400, want: "no nonce"},
		"empty nonce":       {target: "/v1/attest?nonce=", code: 400, want: "nonce of 0 bytes, want 16..64"},
		"short nonce":       {target: "/v1/attest?nonce=" + strings.Repeat("ab", 15), code: 400, want: "nonce of 15 bytes, want 16..64"},
		"long nonce":        {target: "/v1/attest?nonce=" + strings.Repeat("ab", 65), code: 400, want: "longer than a nonce query can be"},
		"odd hex":           {target: "/v1/attest?nonce=" + strings.Repeat("a", 33), code: 400, want: "nonce is not hex"},
		"not hex":           {target: "/v1/attest?nonce=" + strings.Repeat("zz", 16), code: 400, want: "nonce is not hex"},
		"nonce twice":       {target: "/v1/attest?nonce=" + strings.Repeat("ab", 16) + "&nonce=" + strings.Repeat("ab", 16), code: 400, want: "nonce given 2 times"},
		"unknown parameter": {target: "/v1/attest?nonce=" + strings.Repeat("ab", 16) + "&x=1", code: 400, want: `unknown query parameter "x"`},
		"malformed query":   {target: "/v1/attest?nonce=%zz", code: 400, want: "malformed query"},
		"POST":              {method: http.MethodPost, target: "/v1/attest?nonce=" + strings.Repeat("ab", 16), code: 405, want: "method POST not allowed"},
		"other path":        {target: "/v2/attest", code: 404, want: "no such endpoint"},
	} {
		t.Run(name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			req, err := http.NewRequest(method, n.httpURL+tc.target, nil)
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, tc.code, resp.StatusCode)
			var body verifyservice.HTTPError
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
			assert.Contains(t, body.Error, tc.want)
		})
	}
}

// The gRPC side refuses bad nonces with InvalidArgument.
func TestGRPCNonceBounds(t *testing.T) {
	ca := newCA(t, "local AK CA")
	n := startNode(t, ca, nodeOptions{marker: clusterID})
	conn, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	client := verifypb.NewVerificationServiceClient(conn)
	for name, tc := range map[string]struct {
		size int
		code codes.Code
	}{
		"empty": {0, codes.InvalidArgument}, "15 bytes": {15, codes.InvalidArgument},
		"16 bytes": {16, codes.OK}, "64 bytes": {64, codes.OK}, "65 bytes": {65, codes.InvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			resp, err := client.GetAttestation(context.Background(), &verifypb.GetAttestationRequest{Nonce: make([]byte, tc.size)})
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			if tc.code != codes.OK {
				assert.ErrorContains(t, err, fmt.Sprintf("nonce of %d bytes, want 16..64", tc.size))
				return
			}
			assert.Equal(t, "qemu-vtpm", resp.Variant)
			assert.NotEmpty(t, resp.Evidence)
		})
	}
}

// blockingIssuer issues once released, or fails when the caller's context ends. It reports
// on entered (if set) when a call has started.
type blockingIssuer struct{ entered, release chan struct{} }

func (b blockingIssuer) Variant() variant.Variant { return qemu.Variant }
func (b blockingIssuer) Issue(ctx context.Context, _ attestation.Purpose, _ []byte) ([]byte, error) {
	if b.entered != nil {
		b.entered <- struct{}{}
	}
	select {
	case <-b.release:
		return []byte("evidence"), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Requests beyond MaxWaiting are refused at once instead of queueing for the TPM; a TPM that
// does not answer within IssueTimeout fails the request.
func TestBusyAndTimeout(t *testing.T) {
	iss := blockingIssuer{entered: make(chan struct{}, 1), release: make(chan struct{})}
	srv, err := verifyservice.New(verifyservice.Config{Issuer: iss, MaxWaiting: 1, IssueTimeout: 20 * time.Second})
	require.NoError(t, err)
	addr := serveGRPC(t, srv)
	url := serveHTTP(t, srv)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	client := verifypb.NewVerificationServiceClient(conn)
	nonce := make([]byte, 32)

	first := make(chan error, 1)
	go func() {
		_, err := client.GetAttestation(context.Background(), &verifypb.GetAttestationRequest{Nonce: nonce})
		first <- err
	}()
	<-iss.entered // the first request holds the only slot
	_, err = client.GetAttestation(context.Background(), &verifypb.GetAttestationRequest{Nonce: nonce})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	resp, err := http.Get(url + "/v1/attest?nonce=" + hex.EncodeToString(nonce))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	close(iss.release)
	require.NoError(t, <-first)

	// Timeout: an issuer that never answers.
	stuck, err := verifyservice.New(verifyservice.Config{Issuer: blockingIssuer{release: make(chan struct{})}, IssueTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	_, err = stuck.GetAttestation(context.Background(), &verifypb.GetAttestationRequest{Nonce: nonce})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.ErrorContains(t, err, "context deadline exceeded")

	_, err = verifyservice.New(verifyservice.Config{})
	assert.ErrorContains(t, err, "no issuer")
}

func FuzzParseNonceQuery(f *testing.F) {
	for _, s := range []string{
		"nonce=" + strings.Repeat("ab", 16), "nonce=" + strings.Repeat("AB", 64), "nonce=", "", "nonce=%zz",
		"nonce=ab&nonce=cd", "x=1&nonce=" + strings.Repeat("00", 16), ";nonce=00", "nonce=" + strings.Repeat("0", 31),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, query string) {
		nonce, err := verifyservice.ParseNonceQuery(query)
		if err != nil {
			assert.Nil(t, nonce)
			return
		}
		assert.NoError(t, verifyservice.CheckNonce(nonce))
		// Only a query of exactly one nonce parameter in hex is accepted.
		again, err := verifyservice.ParseNonceQuery("nonce=" + hex.EncodeToString(nonce))
		require.NoError(t, err)
		assert.Equal(t, nonce, again)
		assert.LessOrEqual(t, len(query), len("nonce=")+2*attestation.MaxNonceSize)
	})
}

// markerRegister is the register of qemu-vtpm that carries the cluster-ID marker.
var markerRegister, _ = variant.QEMUVTPM.ClusterIDRegister()
