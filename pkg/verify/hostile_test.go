package verify_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/pkg/api/verify/verifypb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/verify"
)

// hostileService is a verification service an attacker runs (a compromised node, or whatever
// answers at the address): it answers every request with resp and err.
type hostileService struct {
	verifypb.UnimplementedVerificationServiceServer
	resp *verifypb.GetAttestationResponse
	err  error
}

func (h hostileService) GetAttestation(context.Context, *verifypb.GetAttestationRequest) (*verifypb.GetAttestationResponse, error) {
	return h.resp, h.err
}

// hostile returns n bytes of what a service sends to act on the verifier's terminal: clear
// the screen, set the window title, return to the line's start and forge a line.
func hostile(n int) string {
	const s = "\x1b[2J\x1b]0;pwned\x07\r\nlevel=ERROR msg=forged "
	return strings.Repeat(s, n/len(s)+1)[:n]
}

// TestHostileService: what the service says, in a status or in its answer's fields, reaches
// the verifier's error (and `constellation verify`'s output) as one line of at most 1 KiB
// without escape sequences or line breaks.
func TestHostileService(t *testing.T) {
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon:         attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(qemu.Variant, nil)}}},
		AcceptUnauthenticatedAK: true,
	})
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		svc     hostileService
		wantErr error
		wantMsg string
	}{
		"256 KiB status message": {
			svc:     hostileService{err: status.Error(codes.Internal, hostile(256<<10))},
			wantMsg: `asking for evidence: rpc error: code = Internal desc = \x1b[2J\x1b]0;pwned\a\r\n`,
		},
		"hostile variant name": {
			svc:     hostileService{resp: &verifypb.GetAttestationResponse{Variant: hostile(200 << 10)}},
			wantErr: attestation.ErrWrongVariant, wantMsg: `attests with variant "\x1b[2J`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := grpc.NewServer()
			verifypb.RegisterVerificationServiceServer(g, tc.svc)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			go func() { _ = g.Serve(ln) }()
			t.Cleanup(g.Stop)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			res, err := verify.Verify(ctx, "worker-0", ln.Addr().String(), v, make([]byte, 32))
			require.Error(t, err)
			assert.Nil(t, res)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
			}
			assert.Contains(t, err.Error(), tc.wantMsg)
			assert.LessOrEqual(t, len(err.Error()), 1<<10)
			for _, c := range []string{"\x1b", "\x07", "\r", "\n"} {
				assert.NotContains(t, err.Error(), c)
			}
		})
	}
}
