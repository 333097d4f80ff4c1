package vtpm_test

import (
	"bytes"
	"context"
	"crypto"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// collateralRefusing is a hardware check whose every other check passed and whose
// collateral's verdict refuses the evidence (revocation unknown offline, or revoked).
type collateralRefusing struct{ verdict error }

func (c collateralRefusing) Check(context.Context, *hardwarepb.Hardware, crypto.PublicKey, []byte, []byte) (*attestation.Hardware, error) {
	return nil, fmt.Errorf("SEV-SNP report: %w", &attestation.CollateralError{Err: c.verdict})
}

// TestCollateralVerdictComesLast: the hardware check's verdict that rests on collateral is
// held until the validator's own checks passed: a quote whose PCRs match no reference set, or
// whose event log the variant's check refuses, is refused for that; only evidence that passes
// them gets the collateral's verdict.
func TestCollateralVerdictComesLast(t *testing.T) {
	data := bytes.Repeat([]byte{7}, 32)
	forgery := vtpmtest.Forge(t, variant.QEMUVTPM, nil, eventlogtest.Image("v1"), attestation.PurposeVerify, data)
	ev := &vtpmpb.Evidence{}
	require.NoError(t, proto.Unmarshal(forgery.Evidence, ev))
	ev.Hardware = &hardwarepb.Hardware{SnpReport: []byte{1}}
	evidence, err := proto.Marshal(ev)
	require.NoError(t, err)

	image := measurements.ReferenceSets{{Name: "v1", Measurements: measurementstest.FromRegisters(variant.QEMUVTPM, forgery.PCRs)}}
	other := measurements.ReferenceSets{{Name: "other", Measurements: measurementstest.Image(variant.QEMUVTPM, map[uint32][]byte{4: bytes.Repeat([]byte{9}, 32)})}}
	noSEVES := func(*eventlog.Log) error {
		return fmt.Errorf("%w: the event log has no SEV-ES event", attestation.ErrMeasurementPolicy)
	}
	for name, verdict := range map[string]error{
		"revocation unknown": fmt.Errorf("CRL of the ASK: offline: %w", attestation.ErrRevocationUnknown),
		"revoked":            fmt.Errorf("ASK revoked: %w", attestation.ErrUntrustedSigner),
	} {
		for caseName, tc := range map[string]struct {
			sets measurements.ReferenceSets
			// logCheck, if set, is the variant's event log check.
			logCheck func(*eventlog.Log) error
			want     error
			msg      string
		}{
			"PCRs outside the reference":    {sets: other, want: attestation.ErrMeasurementPolicy, msg: "match none"},
			"event log the variant refuses": {sets: image, logCheck: noSEVES, want: attestation.ErrMeasurementPolicy, msg: "no SEV-ES event"},
			"nothing else wrong":            {sets: image, logCheck: func(*eventlog.Log) error { return nil }, want: errors.Unwrap(verdict)},
		} {
			t.Run(name+"/"+caseName, func(t *testing.T) {
				cfg := vtpm.ValidatorConfig{
					ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: tc.sets},
					Variant:         variant.QEMUVTPM,
					Hardware:        collateralRefusing{verdict: verdict},
				}
				if tc.logCheck != nil {
					cfg.EventLog, cfg.EventLogCheck = vtpm.EventLogRequired, tc.logCheck
				}
				v, err := vtpm.NewValidator(cfg)
				require.NoError(t, err)
				_, err = v.Validate(context.Background(), evidence, attestation.PurposeVerify, data)
				require.ErrorIs(t, err, tc.want)
				assert.Equal(t, attestation.Reason(tc.want), attestation.Reason(err), "%v", err)
				_, isCollateral := errors.AsType[*attestation.CollateralError](err)
				assert.Equal(t, tc.msg == "", isCollateral, "only the last verdict is the collateral's: %v", err)
				if tc.msg != "" {
					assert.ErrorContains(t, err, tc.msg)
				}
			})
		}
	}
}
