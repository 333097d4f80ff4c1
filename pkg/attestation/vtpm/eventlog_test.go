package vtpm_test

import (
	"bytes"
	"context"
	"crypto"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-eventlog/tcg"
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
		v, err := vtpm.NewValidator(vtpm.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets}, Variant: variant.QEMUVTPM, AcceptUnauthenticatedAK: true, EventLog: vtpm.EventLogRequired})
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
			v, err := vtpm.NewValidator(vtpm.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets}, Variant: variant.QEMUVTPM, AcceptUnauthenticatedAK: true, EventLog: tc.policy, EventLogCheck: tc.check})
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
		_, err := vtpm.NewValidator(vtpm.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets}, Variant: variant.QEMUVTPM, AcceptUnauthenticatedAK: true, EventLog: p, EventLogCheck: check})
		assert.ErrorContains(t, err, "needs the event log policy required", p.String())
	}
	_, err := vtpm.NewValidator(vtpm.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets}, Variant: variant.QEMUVTPM, AcceptUnauthenticatedAK: true, EventLog: 42})
	assert.ErrorContains(t, err, "unknown event log policy")
}

// TestAKTrustIsExplicit: a validator is built only if something vouches for the AK (roots, a
// hardware check whose report names it) or the caller accepts that nothing does; and then
// every result says so.
func TestAKTrustIsExplicit(t *testing.T) {
	sets := measurements.ReferenceSets{{Name: "zero", Measurements: measurementstest.Image(variant.QEMUVTPM, nil)}}
	roots := vtpmtest.NewCA(t, "AK CA", nil).Pool()
	testCases := map[string]struct {
		cfg     vtpm.ValidatorConfig
		wantMsg string
	}{
		"nothing vouches":     {cfg: vtpm.ValidatorConfig{}, wantMsg: "no AK roots"},
		"roots":               {cfg: vtpm.ValidatorConfig{AKRoots: roots}},
		"hardware check":      {cfg: vtpm.ValidatorConfig{Hardware: noHardware{}}},
		"opt-in":              {cfg: vtpm.ValidatorConfig{AcceptUnauthenticatedAK: true}},
		"opt-in beside roots": {cfg: vtpm.ValidatorConfig{AKRoots: roots, AcceptUnauthenticatedAK: true}, wantMsg: "exclude each other"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			tc.cfg.Variant, tc.cfg.ReferenceSets = variant.QEMUVTPM, sets
			_, err := vtpm.NewValidator(tc.cfg)
			if tc.wantMsg == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantMsg)
		})
	}

	tpm := vtpmtest.Simulator(t)
	log := eventlogtest.Boot(t, tpm, eventlogtest.Image("v1"))
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	iss, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: variant.QEMUVTPM, EventLog: func() ([]byte, error) { return log, nil }})
	require.NoError(t, err)
	t.Cleanup(func() { iss.Close() })
	data := bytes.Repeat([]byte{7}, 32)
	ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, data)
	require.NoError(t, err)
	v, err := vtpm.NewValidator(vtpm.ValidatorConfig{
		ValidatorCommon:         attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "v1", Measurements: measurementstest.FromRegisters(variant.QEMUVTPM, pcrs)}}},
		Variant:                 variant.QEMUVTPM,
		AcceptUnauthenticatedAK: true,
		EventLog:                vtpm.EventLogRequired,
	})
	require.NoError(t, err)
	got, err := v.Validate(context.Background(), ev, attestation.PurposeVerify, data)
	require.NoError(t, err)
	assert.False(t, got.SignerCertified)
	assert.Equal(t, []string{vtpm.UnauthenticatedAKWarning}, got.Warnings)
}

// noHardware stands in for a hardware check; the test only builds the validator.
type noHardware struct{}

func (noHardware) Check(context.Context, *hardwarepb.Hardware, crypto.PublicKey, []byte, []byte) (*attestation.Hardware, error) {
	return nil, errors.New("not called")
}
