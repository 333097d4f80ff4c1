package choose

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// pcrSets is a valid reference set for the vTPM variants (PCRs 0..14 enforced).
func pcrSets() measurements.ReferenceSets {
	m := measurements.M{}
	for i := range uint32(15) {
		m[i] = measurements.Measurement{Expected: bytes.Repeat([]byte{byte(i)}, 32)}
	}
	return measurements.ReferenceSets{{Name: "v1", Measurements: m}}
}

func tdxSets() measurements.ReferenceSets {
	m := measurements.M{}
	for _, i := range variant.QEMUTDX.ImageRegisters() {
		m[i] = measurements.Measurement{Expected: bytes.Repeat([]byte{byte(i)}, 48)}
	}
	return measurements.ReferenceSets{{Name: "v1", Measurements: m}}
}

func snpReference() *snp.Reference {
	ref := snp.DefaultReference("milan-2025")
	ref.Products = []string{"Milan"}
	ref.MinimumTCB = map[string]snp.TCB{"Milan": {Bootloader: 3, TEE: 0, SNP: 8, Microcode: 115}}
	ref.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
	return &ref
}

func tdxReference() *tdx.Reference {
	return &tdx.Reference{
		Name:             "tdx-1.5",
		MrSeam:           []tdx.HexBytes{bytes.Repeat([]byte{2}, 48)},
		TdAttributes:     make(tdx.HexBytes, 8),
		Xfam:             tdx.HexBytes{0xe7, 0x18, 0x06, 0, 0, 0, 0, 0},
		MinimumTeeTcbSvn: make(tdx.HexBytes, 16),
	}
}

// references returns a valid Reference for every implemented variant.
func references() map[variant.Variant]Reference {
	return map[variant.Variant]Reference{
		variant.QEMUVTPM:           {Variant: variant.QEMUVTPM, Values: Values{Measurements: pcrSets(), AKRoots: testCAPEM}},
		variant.QEMUTDX:            {Variant: variant.QEMUTDX, Values: Values{Measurements: tdxSets(), HardwareValues: HardwareValues{TDX: tdxReference()}}},
		variant.AWSSEVSNP:          {Variant: variant.AWSSEVSNP, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{SNP: snpReference()}}},
		variant.GCPSEVSNP:          {Variant: variant.GCPSEVSNP, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{SNP: snpReference()}}},
		variant.AzureSEVSNP:        {Variant: variant.AzureSEVSNP, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{SNP: snpReference()}}},
		variant.AzureTDX:           {Variant: variant.AzureTDX, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{TDX: tdxReference()}}},
		variant.AzureTrustedLaunch: {Variant: variant.AzureTrustedLaunch, Values: Values{Measurements: pcrSets()}},
		variant.GCPSEVES:           {Variant: variant.GCPSEVES, Values: Values{Measurements: pcrSets()}},
		variant.AWSNitroTPM:        {Variant: variant.AWSNitroTPM, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{AcceptUnauthenticatedAK: true}}},
	}
}

func TestEveryImplementedVariantBuildsItsValidator(t *testing.T) {
	refs := references()
	offline := Options{Collateral: collateral.New(collateral.Config{})}
	for _, v := range Implemented() {
		ref, ok := refs[v]
		require.True(t, ok, "test has no reference for %s", v)
		require.NoError(t, ref.Validate(), v.String())
		val, err := NewValidator(ref, offline)
		require.NoError(t, err, v.String())
		assert.Equal(t, v, val.Variant(), "the registry built another variant's validator")

		// Evidence of no kind is refused as malformed, never accepted.
		_, err = val.Validate(context.Background(), []byte("not evidence"), attestation.PurposeVerify, bytes.Repeat([]byte{1}, 32))
		assert.ErrorIs(t, err, attestation.ErrMalformed, v.String())
	}
}

// TestEventLogRule pins the event-log rule of every variant (docs/attestation.md, "The
// variant catalog"): required where nothing but the vTPM vouches for the boot, replayed if
// present where a hardware report vouches for the platform, none for qemu-tdx (no vTPM).
func TestEventLogRule(t *testing.T) {
	want := map[variant.Variant]string{
		variant.QEMUVTPM:           "required",
		variant.AzureTrustedLaunch: "required",
		variant.GCPSEVES:           "required",
		variant.AWSNitroTPM:        "required",
		variant.AWSSEVSNP:          "replay-if-present",
		variant.GCPSEVSNP:          "replay-if-present",
		variant.AzureSEVSNP:        "replay-if-present",
		variant.AzureTDX:           "replay-if-present",
		variant.QEMUTDX:            "none",
	}
	refs := references()
	for _, v := range Implemented() {
		val, err := NewValidator(refs[v], Options{Collateral: collateral.New(collateral.Config{})})
		require.NoError(t, err)
		got := "none"
		if p, ok := val.(interface{ EventLogPolicy() vtpm.EventLogPolicy }); ok {
			got = p.EventLogPolicy().String()
		}
		assert.Equal(t, want[v], got, v.String())
	}
}

func TestNotImplementedVariantsSaySo(t *testing.T) {
	implemented := map[variant.Variant]bool{}
	for _, v := range Implemented() {
		implemented[v] = true
	}
	for _, v := range variant.All() {
		if implemented[v] {
			continue
		}
		_, err := NewValidator(Reference{Variant: v, Values: Values{Measurements: pcrSets()}}, Options{})
		assert.ErrorIs(t, err, ErrNotImplemented, v.String())
		_, err = NewIssuer(context.Background(), v, IssuerEnv{})
		assert.ErrorIs(t, err, ErrNotImplemented, v.String())
	}
	_, err := NewValidator(Reference{}, Options{})
	assert.ErrorContains(t, err, "no attestation variant")
}

func TestHardwareBlocksBelongToTheirVariants(t *testing.T) {
	for name, tc := range map[string]struct {
		ref       Reference
		wantField string
	}{
		"snp variant without snp":                 {Reference{Variant: variant.AzureSEVSNP, Values: Values{Measurements: pcrSets()}}, "snp"},
		"tdx variant without tdx":                 {Reference{Variant: variant.QEMUTDX, Values: Values{Measurements: tdxSets()}}, "tdx"},
		"snp block on a tpm variant":              {Reference{Variant: variant.QEMUVTPM, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{SNP: snpReference()}}}, "snp"},
		"tdx block on an snp variant":             {Reference{Variant: variant.AWSSEVSNP, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{SNP: snpReference(), TDX: tdxReference()}}}, "tdx"},
		"invalid snp block":                       {Reference{Variant: variant.GCPSEVSNP, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{SNP: &snp.Reference{}}}}, "snp"},
		"ak roots on a variant that ignores them": {Reference{Variant: variant.AWSSEVSNP, Values: Values{Measurements: pcrSets(), AKRoots: testCAPEM, HardwareValues: HardwareValues{SNP: snpReference()}}}, "akRoots"},
		"malformed ak roots":                      {Reference{Variant: variant.QEMUVTPM, Values: Values{Measurements: pcrSets(), AKRoots: "not pem"}}, "akRoots"},
		"no measurements":                         {Reference{Variant: variant.QEMUVTPM}, "measurements"},
		"tdx registers on a tpm variant":          {Reference{Variant: variant.QEMUVTPM, Values: Values{Measurements: tdxSets()}}, "measurements"},
		"opt-in on a variant that certifies AKs":  {Reference{Variant: variant.GCPSEVES, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{AcceptUnauthenticatedAK: true}}}, "acceptUnauthenticatedAK"},
		"opt-in on an snp variant":                {Reference{Variant: variant.AzureSEVSNP, Values: Values{Measurements: pcrSets(), HardwareValues: HardwareValues{SNP: snpReference(), AcceptUnauthenticatedAK: true}}}, "acceptUnauthenticatedAK"},
		"opt-in beside ak roots":                  {Reference{Variant: variant.QEMUVTPM, Values: Values{Measurements: pcrSets(), AKRoots: testCAPEM, HardwareValues: HardwareValues{AcceptUnauthenticatedAK: true}}}, "acceptUnauthenticatedAK"},
		"nitro without the opt-in":                {Reference{Variant: variant.AWSNitroTPM, Values: Values{Measurements: pcrSets()}}, "acceptUnauthenticatedAK"},
	} {
		err := tc.ref.Validate()
		var fe *FieldError
		require.True(t, errors.As(err, &fe), "%s: %v", name, err)
		assert.Equal(t, tc.wantField, fe.Field, name)
		_, err = NewValidator(tc.ref, Options{Collateral: collateral.New(collateral.Config{})})
		assert.Error(t, err, name)
	}
}

// qemu-vtpm takes its AK roots from the platform when the configuration has none, so a
// reference without roots or opt-in is valid; the validator is not built without one of them.
func TestQEMUVTPMNeedsRootsOrOptIn(t *testing.T) {
	bare := Reference{Variant: variant.QEMUVTPM, Values: Values{Measurements: pcrSets()}}
	require.NoError(t, bare.Validate())
	_, err := NewValidator(bare, Options{})
	assert.ErrorContains(t, err, "no AK roots")

	optIn := bare
	optIn.AcceptUnauthenticatedAK = true
	require.NoError(t, optIn.Validate())
	v, err := NewValidator(optIn, Options{})
	require.NoError(t, err)
	assert.Equal(t, variant.QEMUVTPM, v.Variant())
}

// testCAPEM is a self-signed CA certificate.
var testCAPEM = func() string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}()

func TestIssuerNeedsItsDevices(t *testing.T) {
	for _, v := range Implemented() {
		_, err := NewIssuer(context.Background(), v, IssuerEnv{})
		assert.Error(t, err, "%s: an issuer without devices must not be built", v)
	}
}
