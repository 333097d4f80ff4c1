package vtpm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-eventlog/tcg"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// TestEventLogPolicy issues evidence on a TPM booted with a genuine event log and checks what
// each event log policy accepts.
func TestEventLogPolicy(t *testing.T) {
	data := bytes.Repeat([]byte{7}, 32)
	tpm := vtpmtest.Simulator(t)
	log := eventlogtest.Boot(t, tpm, eventlogtest.Image("v1"))
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	sets := measurements.ReferenceSets{{Name: "v1", Measurements: measurementstest.FromRegisters(variant.QEMUVTPM, pcrs)}}

	iss, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: variant.QEMUVTPM, EventLog: func() ([]byte, error) { return log, nil }})
	require.NoError(t, err)
	t.Cleanup(func() { iss.Close() })
	withLog, err := iss.Issue(context.Background(), attestation.PurposeVerify, data)
	require.NoError(t, err)
	withLogPB := &vtpmpb.Evidence{}
	require.NoError(t, proto.Unmarshal(withLog, withLogPB))
	with := func(l []byte) []byte {
		ev := proto.Clone(withLogPB).(*vtpmpb.Evidence)
		ev.EventLog = l
		b, err := proto.Marshal(ev)
		require.NoError(t, err)
		return b
	}
	// A log that claims another bootloader in PCR 4: the PCRs stay the genuine ones.
	lie := eventlog.NewBuilder()
	for _, m := range eventlogtest.Image("v1") {
		if m.Type == tcg.Ipl && m.PCR == 4 {
			m.Data = []byte("bootloader v2")
		}
		lie.Add(m.PCR, m.Type, m.Data)
	}
	errNotSEV := fmt.Errorf("%w: not what the platform check wants", attestation.ErrMeasurementPolicy)

	testCases := map[string]struct {
		policy   vtpm.EventLogPolicy
		check    func(*eventlog.Log) error
		evidence []byte
		wantErr  error
		wantMsg  string
	}{
		"required, genuine log":          {policy: vtpm.EventLogRequired, evidence: withLog},
		"required, no log":               {policy: vtpm.EventLogRequired, evidence: with(nil), wantErr: attestation.ErrMalformed, wantMsg: "no event log"},
		"required, log lies about PCR 4": {policy: vtpm.EventLogRequired, evidence: with(lie.Bytes()), wantErr: attestation.ErrMalformed, wantMsg: "quoted value of PCR 4"},
		"required, garbage log":          {policy: vtpm.EventLogRequired, evidence: with([]byte("garbage")), wantErr: attestation.ErrMalformed, wantMsg: "event log"},
		"replay-if-present, genuine log": {policy: vtpm.EventLogReplayIfPresent, evidence: withLog},
		"replay-if-present, no log":      {policy: vtpm.EventLogReplayIfPresent, evidence: with(nil)},
		"replay-if-present, log lies":    {policy: vtpm.EventLogReplayIfPresent, evidence: with(lie.Bytes()), wantErr: attestation.ErrMalformed, wantMsg: "quoted value of PCR 4"},
		"ignore, log lies":               {policy: vtpm.EventLogIgnore, evidence: with(lie.Bytes())},
		"required, check passes on replayed log": {policy: vtpm.EventLogRequired, evidence: withLog, check: func(l *eventlog.Log) error {
			if len(l.Events()) != len(eventlogtest.Image("v1")) {
				return errors.New("wrong event count")
			}
			return nil
		}},
		"required, check rejects": {policy: vtpm.EventLogRequired, evidence: withLog, check: func(*eventlog.Log) error { return errNotSEV }, wantErr: attestation.ErrMeasurementPolicy, wantMsg: "not what the platform check wants"},
	}
	// One validator sees genuine evidence, then the same quote with a lying log: the replay
	// it remembers from the genuine log must not admit the other.
	t.Run("remembered replay does not admit another log", func(t *testing.T) {
		v, err := vtpm.NewValidator(vtpm.ValidatorConfig{Variant: variant.QEMUVTPM, ReferenceSets: sets, EventLog: vtpm.EventLogRequired})
		require.NoError(t, err)
		for range 2 {
			_, err = v.Validate(context.Background(), withLog, attestation.PurposeVerify, data)
			require.NoError(t, err)
		}
		_, err = v.Validate(context.Background(), with(lie.Bytes()), attestation.PurposeVerify, data)
		require.ErrorIs(t, err, attestation.ErrMalformed)
		assert.ErrorContains(t, err, "quoted value of PCR 4")
	})
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			v, err := vtpm.NewValidator(vtpm.ValidatorConfig{Variant: variant.QEMUVTPM, ReferenceSets: sets, EventLog: tc.policy, EventLogCheck: tc.check})
			require.NoError(t, err)
			_, err = v.Validate(context.Background(), tc.evidence, attestation.PurposeVerify, data)
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.wantMsg)
		})
	}
}

func TestEventLogPolicyConfig(t *testing.T) {
	sets := measurements.ReferenceSets{{Name: "zero", Measurements: measurementstest.Image(variant.QEMUVTPM, nil)}}
	check := func(*eventlog.Log) error { return nil }
	for _, p := range []vtpm.EventLogPolicy{vtpm.EventLogReplayIfPresent, vtpm.EventLogIgnore} {
		_, err := vtpm.NewValidator(vtpm.ValidatorConfig{Variant: variant.QEMUVTPM, ReferenceSets: sets, EventLog: p, EventLogCheck: check})
		assert.ErrorContains(t, err, "needs the event log policy required", p.String())
	}
	_, err := vtpm.NewValidator(vtpm.ValidatorConfig{Variant: variant.QEMUVTPM, ReferenceSets: sets, EventLog: 42})
	assert.ErrorContains(t, err, "unknown event log policy")
}
