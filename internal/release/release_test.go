package release_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

func digest(b byte, n int) []byte {
	d := make([]byte, n)
	for i := range d {
		d[i] = b
	}
	return d
}

// manifest is a release supporting qemu-vtpm and aws-nitro-tpm, whose images measure
// distinct values.
// azureImage is the gallery image version manifest() names for Azure's nodes.
const azureImage = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/node/versions/1.2.0"

func manifest() release.Manifest {
	vtpm := variant.QEMUVTPM
	return release.Manifest{
		Version:           "v1.2.0",
		KubernetesVersion: "v1.34.4",
		NodeImage:         release.Image{Ref: "images/node-v1.2.0", Digest: "sha256:" + strings.Repeat("ab", 32)},
		ServicesImage:     release.Image{Ref: "registry.local/constellation/services:v1.2.0", Digest: "sha256:" + strings.Repeat("cd", 32)},
		CloudImages: []release.CloudImage{{
			Provider: "azure", Ref: azureImage, Digest: "sha256:" + strings.Repeat("ef", 32),
		}},
		References: []choose.Reference{
			{Variant: vtpm, Values: choose.Values{
				Measurements:   measurements.ReferenceSets{{Name: "v1.2.0", Measurements: measurementstest.Image(vtpm, map[uint32][]byte{4: digest(4, 32), 11: digest(11, 32)})}},
				HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: true},
			}},
			{Variant: variant.AWSNitroTPM, Values: choose.Values{
				Measurements:   measurements.ReferenceSets{{Name: "v1.2.0", Measurements: measurementstest.Image(variant.AWSNitroTPM, map[uint32][]byte{4: digest(4, 32)})}},
				HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: true},
			}},
		},
	}
}

func newSigner(t *testing.T) *release.Signer {
	t.Helper()
	s, err := release.GenerateKey()
	require.NoError(t, err)
	return s
}

func sign(t *testing.T, m release.Manifest, s *release.Signer) []byte {
	t.Helper()
	data, err := release.Sign(context.Background(), m, s)
	require.NoError(t, err)
	return data
}

// envelope and marshal let a test edit a signed release as an attacker would: as JSON.
func envelope(t *testing.T, data []byte) dsse.Envelope {
	t.Helper()
	var env dsse.Envelope
	require.NoError(t, json.Unmarshal(data, &env))
	return env
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	return data
}

// editPayload decodes the signed statement, lets edit change it (as generic JSON) and puts it
// back into the envelope, keeping the signatures.
func editPayload(t *testing.T, data []byte, edit func(st map[string]any)) []byte {
	t.Helper()
	env := envelope(t, data)
	payload, err := env.DecodeB64Payload()
	require.NoError(t, err)
	var st map[string]any
	require.NoError(t, json.Unmarshal(payload, &st))
	edit(st)
	env.Payload = base64.StdEncoding.EncodeToString(marshal(t, st))
	return marshal(t, env)
}

// signPayload signs arbitrary payload bytes with s, as the holder of the key could.
func signPayload(t *testing.T, s *release.Signer, payloadType string, payload []byte) []byte {
	t.Helper()
	es, err := dsse.NewEnvelopeSigner(s)
	require.NoError(t, err)
	env, err := es.SignPayload(context.Background(), payloadType, payload)
	require.NoError(t, err)
	return marshal(t, env)
}

func TestOpenAcceptsASignedRelease(t *testing.T) {
	_, edPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	edSigner, err := release.NewSigner(edPriv)
	require.NoError(t, err)
	for name, s := range map[string]*release.Signer{"ECDSA P-256": newSigner(t), "Ed25519": edSigner} {
		t.Run(name, func(t *testing.T) {
			m := manifest()
			got, err := release.Open(context.Background(), sign(t, m, s), s.Public(), release.Policy{Running: "v1.1.3", Variant: variant.AWSNitroTPM})
			require.NoError(t, err)
			assert.Equal(t, m, got.Manifest())
			assert.Equal(t, s.Public().KeyID(), got.KeyID())
			assert.False(t, got.Downgrade())
			ref, ok := got.Reference(variant.QEMUVTPM)
			require.True(t, ok)
			assert.Equal(t, m.References[0], ref)
			_, ok = got.Reference(variant.AzureSEVSNP)
			assert.False(t, ok)
			azure, ok := got.CloudImage("azure")
			require.True(t, ok)
			assert.Equal(t, azureImage, azure.Ref)
			_, ok = got.CloudImage("gcp")
			assert.False(t, ok)
		})
	}
}

// The pinned key travels as PEM (the CLI's configuration); only P-256 and Ed25519 are keys.
func TestPublicKeyPEM(t *testing.T) {
	s := newSigner(t)
	pemData, err := s.Public().MarshalPEM()
	require.NoError(t, err)
	k, err := release.ParsePublicKey(pemData)
	require.NoError(t, err)
	assert.Equal(t, s.Public().KeyID(), k.KeyID())

	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	_, err = release.NewPublicKey(&p384.PublicKey)
	assert.ErrorContains(t, err, "want P-256")
	_, err = release.ParsePublicKey([]byte("not a key"))
	assert.ErrorContains(t, err, "PEM PUBLIC KEY")
	_, err = release.ParsePublicKey(append(pemData, "junk"...))
	assert.ErrorContains(t, err, "data after the PEM block")
}

// The signing key round-trips through PEM (what `make` writes once) and signs releases the
// public key verifies; only PKCS #8 P-256 and Ed25519 keys are read.
func TestSignerPEM(t *testing.T) {
	for name, gen := range map[string]func() crypto.Signer{
		"ECDSA P-256": func() crypto.Signer {
			k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			require.NoError(t, err)
			return k
		},
		"Ed25519": func() crypto.Signer {
			_, k, err := ed25519.GenerateKey(rand.Reader)
			require.NoError(t, err)
			return k
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := release.NewSigner(gen())
			require.NoError(t, err)
			pemData, err := s.MarshalPrivatePEM()
			require.NoError(t, err)
			back, err := release.ParseSigner(pemData)
			require.NoError(t, err)
			assert.Equal(t, s.Public().KeyID(), back.Public().KeyID())
			_, err = release.Open(context.Background(), sign(t, manifest(), back), s.Public(), release.Policy{})
			require.NoError(t, err)
		})
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(p384)
	require.NoError(t, err)
	_, err = release.ParseSigner(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	assert.ErrorContains(t, err, "want P-256")
	pub, err := newSigner(t).Public().MarshalPEM()
	require.NoError(t, err)
	_, err = release.ParseSigner(pub)
	assert.ErrorContains(t, err, "PRIVATE KEY")
}

// The attacks of issue 23, item 1, from the attacker's side: each refused, with its reason.
func TestOpenRefuses(t *testing.T) {
	pinned := newSigner(t)
	attacker := newSigner(t)
	good := sign(t, manifest(), pinned)

	testCases := map[string]struct {
		data    func(t *testing.T) []byte
		policy  release.Policy
		reason  release.Reason
		wantErr string
	}{
		"unsigned envelope": {
			data: func(t *testing.T) []byte {
				env := envelope(t, good)
				env.Signatures = nil
				return marshal(t, env)
			},
			reason: release.ReasonUnsigned, wantErr: "no signature",
		},
		"empty signature": {
			data: func(t *testing.T) []byte {
				env := envelope(t, good)
				env.Signatures[0].Sig = ""
				return marshal(t, env)
			},
			reason: release.ReasonUnsigned, wantErr: "signature #0 is empty",
		},
		"signed by another key": {
			data:   func(t *testing.T) []byte { return sign(t, manifest(), attacker) },
			reason: release.ReasonWrongKey, wantErr: "not by the pinned key " + pinned.Public().KeyID(),
		},
		"another key's signature claiming the pinned key's ID": {
			data: func(t *testing.T) []byte {
				env := envelope(t, sign(t, manifest(), attacker))
				env.Signatures[0].KeyID = pinned.Public().KeyID()
				return marshal(t, env)
			},
			reason: release.ReasonTampered, wantErr: "does not match the release's contents",
		},
		"measurement tampered after signing": {
			data: func(t *testing.T) []byte {
				return editPayload(t, good, func(st map[string]any) {
					refs := st["predicate"].(map[string]any)["references"].([]any)
					sets := refs[0].(map[string]any)["measurements"].([]any)
					sets[0].(map[string]any)["measurements"].(map[string]any)["4"] = map[string]any{"expected": strings.Repeat("66", 32), "warnOnly": false}
				})
			},
			reason: release.ReasonTampered, wantErr: "does not match the release's contents",
		},
		"subject digest tampered after signing": {
			data: func(t *testing.T) []byte {
				return editPayload(t, good, func(st map[string]any) {
					st["subject"].([]any)[0].(map[string]any)["digest"] = map[string]any{"sha256": strings.Repeat("00", 32)}
				})
			},
			reason: release.ReasonTampered,
		},
		"payload type swapped after signing": {
			data: func(t *testing.T) []byte {
				env := envelope(t, good)
				env.PayloadType = "application/json"
				return marshal(t, env)
			},
			reason: release.ReasonMalformed, wantErr: `payload type "application/json"`,
		},
		// The PAE binds the type: the pinned key's signature of these bytes as another type
		// (a signature the key made for another purpose) is no release signature.
		"pinned key's signature over the statement as another payload type": {
			data: func(t *testing.T) []byte {
				env := envelope(t, good)
				payload, err := env.DecodeB64Payload()
				require.NoError(t, err)
				other := envelope(t, signPayload(t, pinned, "application/json", payload))
				env.Signatures = other.Signatures
				return marshal(t, env)
			},
			reason: release.ReasonTampered,
		},
		"pinned key signed a statement of another predicate type": {
			data: func(t *testing.T) []byte {
				env := envelope(t, good)
				payload, err := env.DecodeB64Payload()
				require.NoError(t, err)
				payload = []byte(strings.Replace(string(payload), release.PredicateType, "https://slsa.dev/provenance/v1", 1))
				return signPayload(t, pinned, release.PayloadType, payload)
			},
			reason: release.ReasonMalformed, wantErr: "predicate type",
		},
		"only another key's signature after the pinned one was stripped": {
			data: func(t *testing.T) []byte {
				env := envelope(t, good)
				env.Signatures = envelope(t, sign(t, manifest(), attacker)).Signatures
				return marshal(t, env)
			},
			reason: release.ReasonWrongKey,
		},
		"reference set leaves a register unenforced": {
			data: func(t *testing.T) []byte {
				m := manifest()
				m.References[0].Measurements[0].Measurements = measurementstest.Image(variant.QEMUVTPM, nil)
				delete(m.References[0].Measurements[0].Measurements, 11)
				return signUnchecked(t, m, pinned)
			},
			reason: release.ReasonUnenforced, wantErr: "missing PCR 11",
		},
		"reference set with a warn-only image register": {
			data: func(t *testing.T) []byte {
				m := manifest()
				set := m.References[1].Measurements[0].Measurements
				set[4] = measurements.Measurement{Expected: set[4].Expected, WarnOnly: true}
				return signUnchecked(t, m, pinned)
			},
			reason: release.ReasonUnenforced, wantErr: "aws-nitro-tpm: ",
		},
		"second set of a variant unenforced": {
			data: func(t *testing.T) []byte {
				m := manifest()
				m.References[0].Measurements = append(m.References[0].Measurements, measurements.ReferenceSet{Name: "weak", Measurements: measurements.M{0: {Expected: digest(0, 32)}}})
				return signUnchecked(t, m, pinned)
			},
			reason: release.ReasonUnenforced, wantErr: `reference set "weak"`,
		},
		"variant listed twice": {
			data: func(t *testing.T) []byte {
				m := manifest()
				m.References = append(m.References, m.References[0])
				return signUnchecked(t, m, pinned)
			},
			reason: release.ReasonInvalidReference, wantErr: "listed twice",
		},
		"release without the cluster's variant": {
			data:   func(*testing.T) []byte { return good },
			policy: release.Policy{Variant: variant.AzureSEVSNP},
			reason: release.ReasonUnsupportedVariant, wantErr: "no reference values for azure-sev-snp (it supports qemu-vtpm, aws-nitro-tpm)",
		},
		"release without an image for the cluster's provider": {
			data:   func(*testing.T) []byte { return good },
			policy: release.Policy{CloudImageOf: "gcp"},
			reason: release.ReasonNoCloudImage, wantErr: "release v1.2.0 names no image for provider gcp (it names images for: azure)",
		},
		// A cloud image is a subject of the statement: a manifest naming one the statement
		// does not list (or another digest) is refused, so the two cannot disagree.
		"cloud image the statement does not list": {
			data: func(t *testing.T) []byte {
				m := manifest()
				m.CloudImages = append(m.CloudImages, release.CloudImage{Provider: "gcp", Ref: "projects/p/global/images/i", Digest: "sha256:" + strings.Repeat("12", 32)})
				return signUnchecked(t, m, pinned)
			},
			reason: release.ReasonMalformed, wantErr: "statement has 3 subjects, want 4",
		},
		"cloud image digest other than its subject's": {
			data: func(t *testing.T) []byte {
				m := manifest()
				m.CloudImages[0].Digest = "sha256:" + strings.Repeat("12", 32)
				return signUnchecked(t, m, pinned)
			},
			reason: release.ReasonMalformed, wantErr: "statement subject cloud-image/azure: digest",
		},
		"two images for one provider": {
			data: func(t *testing.T) []byte {
				m := manifest()
				other := m.CloudImages[0]
				other.Ref = strings.Replace(other.Ref, "1.2.0", "6.6.6", 1)
				m.CloudImages = append(m.CloudImages, other)
				return signUnchecked(t, m, pinned)
			},
			reason: release.ReasonMalformed, wantErr: "two cloud images of one provider",
		},
		"cloud image ref with a line break": {
			data: func(t *testing.T) []byte {
				m := manifest()
				m.CloudImages[0].Ref += "\nprovider.azure.image: evil"
				return signUnchecked(t, m, pinned)
			},
			reason: release.ReasonMalformed, wantErr: "printable characters without spaces",
		},
		"cloud image of no provider's name": {
			data: func(t *testing.T) []byte {
				m := manifest()
				m.CloudImages[0].Provider = "Azure"
				return signUnchecked(t, m, pinned)
			},
			reason: release.ReasonMalformed, wantErr: "cloud-image/Azure",
		},
		"downgrade": {
			data:   func(*testing.T) []byte { return good },
			policy: release.Policy{Running: "v1.10.0"},
			reason: release.ReasonDowngrade, wantErr: "release v1.2.0 is older than the running v1.10.0",
		},
		"oversize input": {
			data: func(t *testing.T) []byte {
				return []byte(`{"payloadType":"` + strings.Repeat("a", release.MaxSize) + `"}`)
			},
			reason: release.ReasonMalformed, wantErr: "limit",
		},
		"too many signatures": {
			data: func(t *testing.T) []byte {
				env := envelope(t, good)
				for range release.MaxSignatures {
					env.Signatures = append(env.Signatures, env.Signatures[0])
				}
				return marshal(t, env)
			},
			reason: release.ReasonMalformed, wantErr: "signatures, limit",
		},
		"unknown envelope field": {
			data: func(t *testing.T) []byte {
				return []byte(strings.Replace(string(good), `"payloadType"`, `"extra":1,"payloadType"`, 1))
			},
			reason: release.ReasonMalformed, wantErr: `unknown field "extra"`,
		},
		"data after the envelope": {
			data:   func(t *testing.T) []byte { return append(append([]byte{}, good...), "{}"...) },
			reason: release.ReasonMalformed, wantErr: "data after",
		},
		"stray closing brace after the envelope": {
			data:   func(t *testing.T) []byte { return append(append([]byte{}, good...), "\n}"...) },
			reason: release.ReasonMalformed, wantErr: "data after",
		},
		"payload not base64": {
			data: func(t *testing.T) []byte {
				env := envelope(t, good)
				env.Payload = "!!!"
				return marshal(t, env)
			},
			reason: release.ReasonMalformed, wantErr: "payload",
		},
		"signed payload is no in-toto statement": {
			data: func(t *testing.T) []byte {
				return signPayload(t, pinned, release.PayloadType, []byte(`{"version":"v9.9.9"}`))
			},
			reason: release.ReasonMalformed, wantErr: "in-toto statement",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := release.Open(context.Background(), tc.data(t), pinned.Public(), tc.policy)
			require.Error(t, err)
			assert.Nil(t, got)
			assert.Equal(t, tc.reason, release.ReasonOf(err), "%v", err)
			assert.ErrorContains(t, err, tc.reason.String())
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
			}
		})
	}
}

// signUnchecked signs m without Sign's checks, as a careless or malicious release process
// could: the verifier must not rely on the signer having checked.
func signUnchecked(t *testing.T, m release.Manifest, s *release.Signer) []byte {
	t.Helper()
	good := manifest()
	data := sign(t, good, s)
	env := envelope(t, data)
	payload, err := env.DecodeB64Payload()
	require.NoError(t, err)
	var st map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(payload, &st))
	st["predicate"] = marshal(t, m)
	return signPayload(t, s, release.PayloadType, marshal(t, st))
}

// Sign refuses what the verifier would refuse: a release process cannot publish one.
func TestSignRefusesAnUnenforcedRelease(t *testing.T) {
	m := manifest()
	delete(m.References[0].Measurements[0].Measurements, 0)
	_, err := release.Sign(context.Background(), m, newSigner(t))
	assert.Equal(t, release.ReasonUnenforced, release.ReasonOf(err), "%v", err)

	m = manifest()
	m.NodeImage.Digest = "sha256:AB"
	_, err = release.Sign(context.Background(), m, newSigner(t))
	assert.ErrorContains(t, err, "node image")

	m = manifest()
	m.CloudImages[0].Digest = "sha256:AB"
	_, err = release.Sign(context.Background(), m, newSigner(t))
	assert.ErrorContains(t, err, "cloudImages[0] (azure)")

	m = manifest()
	m.CloudImages = append(m.CloudImages, m.CloudImages[0])
	_, err = release.Sign(context.Background(), m, newSigner(t))
	assert.ErrorContains(t, err, "provider azure has two images")

	m = manifest()
	m.CloudImages[0].Provider = "Azure"
	_, err = release.Sign(context.Background(), m, newSigner(t))
	assert.ErrorContains(t, err, `cloudImages[0]: provider "Azure"`)

	m = manifest()
	m.KubernetesVersion = "1.34"
	_, err = release.Sign(context.Background(), m, newSigner(t))
	assert.ErrorContains(t, err, `kubernetesVersion "1.34"`)
	// The verifier checks it too.
	s := newSigner(t)
	_, err = release.Open(context.Background(), signUnchecked(t, m, s), s.Public(), release.Policy{})
	assert.Equal(t, release.ReasonMalformed, release.ReasonOf(err), "%v", err)
	assert.ErrorContains(t, err, `kubernetesVersion "1.34"`)
}

func TestDowngradePolicy(t *testing.T) {
	s := newSigner(t)
	data := sign(t, manifest(), s) // v1.2.0
	for name, tc := range map[string]struct {
		policy        release.Policy
		wantDowngrade bool
		reason        release.Reason
	}{
		"no cluster yet":                 {policy: release.Policy{}},
		"upgrade":                        {policy: release.Policy{Running: "v1.1.9"}},
		"same version (re-apply)":        {policy: release.Policy{Running: "v1.2.0"}},
		"pre-release of the same":        {policy: release.Policy{Running: "v1.2.0-rc.1"}},
		"downgrade refused":              {policy: release.Policy{Running: "v1.2.1"}, reason: release.ReasonDowngrade},
		"downgrade allowed":              {policy: release.Policy{Running: "v1.2.1", AllowDowngrade: true}, wantDowngrade: true},
		"downgrade across minor allowed": {policy: release.Policy{Running: "v2.0.0", AllowDowngrade: true}, wantDowngrade: true},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := release.Open(context.Background(), data, s.Public(), tc.policy)
			if tc.reason != 0 {
				assert.Equal(t, tc.reason, release.ReasonOf(err), "%v", err)
				assert.ErrorContains(t, err, "--allow-downgrade")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantDowngrade, got.Downgrade())
		})
	}
}

// Any one signature by the pinned key suffices; others beside it, valid or not, by keys the
// CLI does not know, neither add nor take away trust (docs/releases.md "Decisions").
func TestSignaturesBesideThePinnedOne(t *testing.T) {
	pinned := newSigner(t)
	other := newSigner(t)
	good := envelope(t, sign(t, manifest(), pinned))
	coSigned := envelope(t, signPayload(t, other, good.PayloadType, mustPayload(t, good)))
	garbage := dsse.Signature{KeyID: "SHA256:unknown", Sig: base64.StdEncoding.EncodeToString([]byte("not a signature"))}

	for name, sigs := range map[string][]dsse.Signature{
		"valid unknown signature after":  {good.Signatures[0], coSigned.Signatures[0]},
		"valid unknown signature before": {coSigned.Signatures[0], good.Signatures[0]},
		"invalid unknown signature":      {garbage, good.Signatures[0]},
	} {
		t.Run(name, func(t *testing.T) {
			env := good
			env.Signatures = sigs
			got, err := release.Open(context.Background(), marshal(t, env), pinned.Public(), release.Policy{})
			require.NoError(t, err)
			assert.Equal(t, pinned.Public().KeyID(), got.KeyID())
		})
	}
}

func mustPayload(t *testing.T, env dsse.Envelope) []byte {
	t.Helper()
	p, err := env.DecodeB64Payload()
	require.NoError(t, err)
	return p
}

// A release is used only under its signed version: a genuine release presented under another
// name (a replay of an older release as a newer one) is refused naming both, before any other
// policy check could word it otherwise (as a downgrade).
func TestNamePolicy(t *testing.T) {
	s := newSigner(t)
	data := sign(t, manifest(), s) // v1.2.0
	got, err := release.Open(context.Background(), data, s.Public(), release.Policy{Name: "v1.2.0"})
	require.NoError(t, err)
	assert.Equal(t, "v1.2.0", got.Manifest().Version)
	for name, p := range map[string]release.Policy{
		"a newer name":                      {Name: "v1.3.0"},
		"a newer name, running the release": {Name: "v1.3.0", Running: "v1.2.0"},
		"a newer name, running a newer one": {Name: "v1.3.0", Running: "v1.2.5"},
		"the same precedence, other build":  {Name: "v1.2.0+other"},
		"no v":                              {Name: "1.2.0"},
		"not a version":                     {Name: "latest"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := release.Open(context.Background(), data, s.Public(), p)
			assert.Equal(t, release.ReasonMisnamed, release.ReasonOf(err), "%v", err)
			assert.ErrorContains(t, err, fmt.Sprintf("published as %q, but signed as v1.2.0", p.Name))
		})
	}
}

// A release version is one form: "v" and a semantic version. Nothing else can be signed or
// accepted, so a version can name a directory and a URL and never leave its folder.
func TestIsVersion(t *testing.T) {
	for _, v := range []string{"v0.1.0", "v1.2.3", "v10.20.30", "v1.2.3-rc.1", "v1.2.3-0.3.7", "v1.2.3+build.5", "v1.2.3-rc-1+b.2"} {
		assert.True(t, release.IsVersion(v), v)
	}
	for _, v := range []string{"", "1.2.3", "v1.2", "v1.2.3.4", "v01.2.3", "v1.02.3", "..", "v1.2.3/..", "v1.2.3-..", "v1.2.3-a..b",
		"v1.2.3-", "v1.2.3+", "v1.2.3 ", " v1.2.3", "v1.2.3\n", `v1.2.3\x`, "V1.2.3", "v1.2.3-rc/1"} {
		assert.False(t, release.IsVersion(v), "%q", v)
	}
	m := manifest()
	m.Version = "1.2.3"
	_, err := release.Sign(context.Background(), m, newSigner(t))
	assert.Equal(t, release.ReasonMalformed, release.ReasonOf(err), "%v", err)
	s := newSigner(t)
	_, err = release.Open(context.Background(), signUnchecked(t, m, s), s.Public(), release.Policy{})
	assert.Equal(t, release.ReasonMalformed, release.ReasonOf(err), "the verifier checks it too: %v", err)
}
