package recovery

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// refuseAll is a validator that is never asked here.
type refuseAll struct{}

func (refuseAll) Variant() variant.Variant { return variant.QEMUVTPM }
func (refuseAll) Validate(context.Context, []byte, attestation.Purpose, []byte) (*attestation.Verified, error) {
	return nil, errors.New("refused")
}

// A node's refusal for now (its attempt limits) is ErrBusy and carries the wait the node asked
// for, bounded by MaxRetryAfter.
func TestBusyCarriesTheNodesRetryAfter(t *testing.T) {
	for name, tc := range map[string]struct {
		delay time.Duration // 0: no RetryInfo
		want  time.Duration
	}{
		"5 s":                 {delay: 5 * time.Second, want: 5 * time.Second},
		"a year: bounded":     {delay: 365 * 24 * time.Hour, want: MaxRetryAfter},
		"none: pace it alone": {},
	} {
		t.Run(name, func(t *testing.T) {
			st := status.New(codes.ResourceExhausted, "rate limited: too many recovery attempts; retry later")
			if tc.delay > 0 {
				var err error
				st, err = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(tc.delay)})
				require.NoError(t, err)
			}
			creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{refuseAll{}}})
			require.NoError(t, err)
			got := Config{Endpoint: "10.42.0.10:9999"}.callError("recovering the node", creds.Recording(), st.Err())
			assert.True(t, errors.Is(got, ErrBusy), "%v", got)
			assert.True(t, Retryable(got))
			d, ok := retry.After(got)
			assert.Equal(t, tc.delay > 0, ok)
			assert.Equal(t, tc.want, d)
		})
	}
}
