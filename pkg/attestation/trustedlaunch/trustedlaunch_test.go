package trustedlaunch_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/trustedlaunch"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var (
	data    = bytes.Repeat([]byte{0x42}, 32)
	testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
)

// azureVM is a Trusted Launch VM as Azure provisions it, with a synthetic CA hierarchy (root
// and intermediate) standing in for Azure's.
type azureVM struct {
	tpm         *vtpm.TPM
	root, inter *vtpmtest.CA
	akPub       []byte
	log         []byte
	sets        measurements.ReferenceSets
	logFile     string
	rogueAKCert []byte // a certificate for the AK by a CA that is not Azure's
}

func newAzureVM(t *testing.T, tpm *vtpm.TPM) *azureVM {
	vm := &azureVM{tpm: tpm, root: vtpmtest.NewCA(t, "test Azure vTPM root", nil)}
	vm.inter = vtpmtest.NewCA(t, "test Azure vTPM CA", vm.root)
	var akKey crypto.PublicKey
	require.NoError(t, tpm.With(func(rw io.ReadWriter) error {
		ak, err := client.NewCachedKey(rw, tpm2.HandleOwner, client.AKTemplateRSA(), trustedlaunch.AKHandle)
		if err != nil {
			return err
		}
		defer ak.Close()
		akKey = ak.PublicKey()
		vm.akPub, err = ak.PublicArea().Encode()
		return err
	}))
	require.NoError(t, tpm.WriteNV(trustedlaunch.AKCertNVIndex, vm.inter.CertifyAK(t, akKey, "vm.TrustedVM.Azure.windows.net")))
	vm.rogueAKCert = vtpmtest.NewCA(t, "attacker", nil).CertifyAK(t, akKey, "vm")
	vm.log = eventlogtest.Boot(t, tpm, eventlogtest.Image("v1"))
	vm.logFile = filepath.Join(t.TempDir(), "binary_bios_measurements")
	require.NoError(t, os.WriteFile(vm.logFile, vm.log, 0o600))
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	vm.sets = measurements.ReferenceSets{{Name: "v1", Measurements: measurementstest.FromRegisters(trustedlaunch.Variant, pcrs)}}
	return vm
}

func (vm *azureVM) validator(t *testing.T, mod func(*trustedlaunch.ValidatorConfig)) *vtpm.Validator {
	cfg := trustedlaunch.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: vm.sets, Now: func() time.Time { return testNow }},
		AKRoots:         vm.root.Pool(),
		AKIntermediates: []*x509.Certificate{vm.inter.Cert},
	}
	if mod != nil {
		mod(&cfg)
	}
	v, err := trustedlaunch.NewValidator(cfg)
	require.NoError(t, err)
	return v
}

func TestTrustedLaunch(t *testing.T) {
	vm := newAzureVM(t, vtpmtest.Simulator(t))
	iss, err := trustedlaunch.NewIssuer(vm.tpm, trustedlaunch.IssuerConfig{EventLog: vtpm.ReadEventLog(vm.logFile)})
	require.NoError(t, err)
	t.Cleanup(func() { iss.Close() })
	require.Equal(t, vm.akPub, iss.AKPublic(), "the issuer quotes with Azure's AK")
	genuine, err := iss.Issue(context.Background(), attestation.PurposeVerify, data)
	require.NoError(t, err)

	got, err := vm.validator(t, nil).Validate(context.Background(), genuine, attestation.PurposeVerify, data)
	require.NoError(t, err)
	assert.True(t, got.SignerCertified)
	assert.Equal(t, "vm.TrustedVM.Azure.windows.net", got.SignerName)
	assert.Equal(t, "v1", got.ReferenceSet)
	assert.Equal(t, vtpmtest.AKID(t, vm.akPub), got.SignerID)

	ev := &vtpmpb.Evidence{}
	require.NoError(t, proto.Unmarshal(genuine, ev))
	assert.Equal(t, vm.log, ev.EventLog, "the issuer read the log from the file")
	tampered := func(f func(ev *vtpmpb.Evidence)) []byte {
		c := proto.Clone(ev).(*vtpmpb.Evidence)
		f(c)
		b, err := proto.Marshal(c)
		require.NoError(t, err)
		return b
	}
	otherLog := eventlogtest.Boot(t, extendNowhere{}, eventlogtest.Image("v2"))

	testCases := map[string]struct {
		evidence []byte
		mod      func(*trustedlaunch.ValidatorConfig)
		wantErr  error
		wantMsg  string
	}{
		"pinned Azure root does not know the test CA": {
			evidence: genuine, mod: func(c *trustedlaunch.ValidatorConfig) { c.AKRoots = nil },
			wantErr: attestation.ErrUntrustedSigner, wantMsg: "AK certificate",
		},
		"intermediate unknown": {
			evidence: genuine, mod: func(c *trustedlaunch.ValidatorConfig) { c.AKIntermediates = nil },
			wantErr: attestation.ErrUntrustedSigner, wantMsg: "AK certificate",
		},
		"AK certificate of another CA": {
			evidence: tampered(func(ev *vtpmpb.Evidence) { ev.AkCert = vm.rogueAKCert }),
			wantErr:  attestation.ErrUntrustedSigner, wantMsg: "AK certificate",
		},
		"no AK certificate": {
			evidence: tampered(func(ev *vtpmpb.Evidence) { ev.AkCert = nil }),
			wantErr:  attestation.ErrUntrustedSigner, wantMsg: "no AK certificate",
		},
		"AK certificate expired": {
			evidence: genuine, mod: func(c *trustedlaunch.ValidatorConfig) {
				c.Now = func() time.Time { return time.Date(2049, 6, 1, 0, 0, 0, 0, time.UTC) }
			},
			wantErr: attestation.ErrUntrustedSigner, wantMsg: "AK certificate",
		},
		"no event log": {
			evidence: tampered(func(ev *vtpmpb.Evidence) { ev.EventLog = nil }),
			wantErr:  attestation.ErrMalformed, wantMsg: "no event log",
		},
		"event log of another image": {
			evidence: tampered(func(ev *vtpmpb.Evidence) { ev.EventLog = otherLog }),
			wantErr:  attestation.ErrMalformed, wantMsg: "quoted value of PCRs [4 8 9]",
		},
		"PCR 4 value": {
			evidence: tampered(func(ev *vtpmpb.Evidence) { ev.Pcrs[4][0] ^= 1 }),
			wantErr:  attestation.ErrBadSignature,
		},
		"quote signature": {
			evidence: tampered(func(ev *vtpmpb.Evidence) { ev.Signature[len(ev.Signature)-1] ^= 1 }),
			wantErr:  attestation.ErrBadSignature,
		},
		"variant": {
			evidence: tampered(func(ev *vtpmpb.Evidence) { ev.Variant = "qemu-vtpm" }),
			wantErr:  attestation.ErrWrongVariant,
		},
		"image not in the reference sets": {
			evidence: genuine, mod: func(c *trustedlaunch.ValidatorConfig) {
				c.ReferenceSets = measurements.ReferenceSets{{Name: "zero", Measurements: measurementstest.Image(trustedlaunch.Variant, nil)}}
			},
			wantErr: attestation.ErrMeasurementPolicy, wantMsg: "PCR 4",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := vm.validator(t, tc.mod).Validate(context.Background(), tc.evidence, attestation.PurposeVerify, data)
			require.ErrorIs(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.wantMsg)
		})
	}
}

// extendNowhere records a log without a TPM.
type extendNowhere struct{}

func (extendNowhere) ExtendPCR(int, []byte) error { return nil }

func TestIssuerNeedsAzureAK(t *testing.T) {
	tpm := vtpmtest.Simulator(t)
	_, err := trustedlaunch.NewIssuer(tpm, trustedlaunch.IssuerConfig{})
	assert.ErrorContains(t, err, "loading platform attestation key", "no AK at Azure's handle")

	require.NoError(t, tpm.With(func(rw io.ReadWriter) error {
		ak, err := client.NewCachedKey(rw, tpm2.HandleOwner, client.AKTemplateRSA(), trustedlaunch.AKHandle)
		if err == nil {
			ak.Close()
		}
		return err
	}))
	_, err = trustedlaunch.NewIssuer(tpm, trustedlaunch.IssuerConfig{})
	assert.ErrorContains(t, err, "no AK certificate at NV index 0x1c101d0")
}

func TestPinnedRoot(t *testing.T) {
	root := trustedlaunch.Root()
	assert.True(t, root.IsCA)
	assert.True(t, root.BasicConstraintsValid)
	assert.Equal(t, "Azure Virtual TPM Root Certificate Authority 2023", root.Subject.CommonName)
	assert.NoError(t, root.CheckSignatureFrom(root), "self-signed")
	fp := sha256.Sum256(root.Raw)
	assert.Equal(t, "e6c596b17f8ffefba5c300f714cfb1260c6028704ecf7becc4ab5018efb00e95", hex.EncodeToString(fp[:]))

	pool := x509.NewCertPool()
	pool.AddCert(root)
	for _, inter := range trustedlaunch.Intermediates() {
		assert.True(t, inter.IsCA)
		_, err := inter.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		assert.NoError(t, err, inter.Subject.CommonName)
	}
}

// TestTrustedLaunchSwtpm runs the variant's issuer configuration as a per-use issuer (how
// nodes issue) against a real swtpm process.
func TestTrustedLaunchSwtpm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	ctx := context.Background()
	proc := vtpmtest.SwtpmProcess(t)
	tpm, err := proc.Open(ctx)
	require.NoError(t, err)
	vm := newAzureVM(t, tpm)
	require.NoError(t, tpm.Close())

	iss, err := vtpm.NewPerUseIssuer(ctx, proc.Open, trustedlaunch.VTPMIssuerConfig(trustedlaunch.IssuerConfig{EventLog: vtpm.ReadEventLog(vm.logFile)}))
	require.NoError(t, err)
	ev, err := iss.Issue(ctx, attestation.PurposeATLSServer, data)
	require.NoError(t, err)
	got, err := vm.validator(t, nil).Validate(ctx, ev, attestation.PurposeATLSServer, data)
	require.NoError(t, err)
	assert.True(t, got.SignerCertified)
	_, err = vm.validator(t, nil).Validate(ctx, ev, attestation.PurposeVerify, data)
	assert.ErrorIs(t, err, attestation.ErrNonceMismatch)
}
