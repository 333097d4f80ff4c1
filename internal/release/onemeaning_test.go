package release_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/release"
)

// signEdited signs, with s, the in-toto statement of manifest() after edit changed its JSON
// text: what the holder of the release key can sign. The signature is valid, so only the
// decoder can refuse the result.
func signEdited(t *testing.T, s *release.Signer, edit func(payload string) string) []byte {
	t.Helper()
	payload := string(mustPayload(t, envelope(t, sign(t, manifest(), s))))
	edited := edit(payload)
	require.NotEqual(t, payload, edited, "the edit changed nothing")
	return signPayload(t, s, release.PayloadType, []byte(edited))
}

// replaceOnce replaces the one occurrence of old in s (and fails the test if there is none).
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	require.Equal(t, 1, strings.Count(s, old), "%q in %s", old, s)
	return strings.Replace(s, old, new, 1)
}

// TestOpenRefusesASignedReleaseWithTwoReadings: a signed release whose JSON names a field twice,
// or in two letter cases, means one thing to a case-sensitive reader (or one that keeps the
// first duplicate) and another to encoding/json (which ignores case and keeps the last). The
// signature is valid; release.Open, which the CLI's release sources call, must refuse it.
func TestOpenRefusesASignedReleaseWithTwoReadings(t *testing.T) {
	pinned := newSigner(t)
	good := sign(t, manifest(), pinned)
	servicesDigest := strings.Repeat("cd", 32)
	evilDigest := strings.Repeat("ee", 32)

	for name, tc := range map[string]struct {
		data    func(t *testing.T) []byte
		wantErr string
	}{
		// The red team's release: v1.2.0 to a case-sensitive tool, v9.9.9 to encoding/json.
		"manifest with version and Version": {
			data: func(t *testing.T) []byte {
				return signEdited(t, pinned, func(p string) string {
					return replaceOnce(t, p, `"version":"v1.2.0"`, `"version":"v1.2.0","Version":"v9.9.9"`)
				})
			},
			wantErr: `field "Version": differs from a known field only in letter case`,
		},
		"manifest with Version only": {
			data: func(t *testing.T) []byte {
				return signEdited(t, pinned, func(p string) string {
					return replaceOnce(t, p, `"version":"v1.2.0"`, `"Version":"v1.2.0"`)
				})
			},
			wantErr: "letter case",
		},
		// The services image the statement's subject names is the one encoding/json reads
		// last; a case-sensitive tool reads the other.
		"manifest with servicesImage and ServicesImage": {
			data: func(t *testing.T) []byte {
				return signEdited(t, pinned, func(p string) string {
					p = replaceOnce(t, p, `"digest":"sha256:`+servicesDigest+`"}`,
						`"digest":"sha256:`+servicesDigest+`"},"ServicesImage":{"ref":"registry.example.com/evil:v1","digest":"sha256:`+evilDigest+`"}`)
					return replaceOnce(t, p, `"sha256":"`+servicesDigest+`"`, `"sha256":"`+evilDigest+`"`)
				})
			},
			wantErr: `field "ServicesImage": differs from a known field only in letter case`,
		},
		"image digest in two cases": {
			data: func(t *testing.T) []byte {
				return signEdited(t, pinned, func(p string) string {
					return replaceOnce(t, p, `"digest":"sha256:`+servicesDigest+`"}`, `"digest":"sha256:`+servicesDigest+`","Digest":"sha256:`+evilDigest+`"}`)
				})
			},
			wantErr: "letter case",
		},
		// The image a cloud's nodes boot: one to a case-sensitive tool, another to encoding/json.
		"cloud image ref in two cases": {
			data: func(t *testing.T) []byte {
				return signEdited(t, pinned, func(p string) string {
					return replaceOnce(t, p, `"ref":"`+azureImage+`"`, `"ref":"`+azureImage+`","Ref":"/subscriptions/evil"`)
				})
			},
			wantErr: `field "Ref" in "/cloudImages/0": differs from a known field only in letter case`,
		},
		"reference value field in two cases": {
			data: func(t *testing.T) []byte {
				return signEdited(t, pinned, func(p string) string {
					return strings.Replace(p, `"acceptUnauthenticatedAK":true`, `"acceptUnauthenticatedAK":true,"AcceptUnauthenticatedAK":false`, 1)
				})
			},
			wantErr: "letter case",
		},
		// protojson refuses a duplicate key of the statement's predicate (a map to it).
		"manifest with version twice": {
			data: func(t *testing.T) []byte {
				return signEdited(t, pinned, func(p string) string {
					return replaceOnce(t, p, `"version":"v1.2.0"`, `"version":"v1.2.0","version":"v9.9.9"`)
				})
			},
			wantErr: "duplicate",
		},
		// The envelope: the signed payload under "Payload", another under "payload".
		"envelope with payload and Payload": {
			data: func(t *testing.T) []byte {
				other := base64.StdEncoding.EncodeToString([]byte(`{"_type":"https://in-toto.io/Statement/v1"}`))
				return []byte(replaceOnce(t, string(good), `"payload":"`, `"payload":"`+other+`","Payload":"`))
			},
			wantErr: "letter case",
		},
		"envelope with signatures twice": {
			data: func(t *testing.T) []byte {
				return []byte(replaceOnce(t, string(good), `"signatures":[`, `"signatures":[],"signatures":[`))
			},
			wantErr: `duplicate member name "signatures"`,
		},
		"signature key ID in two cases": {
			data: func(t *testing.T) []byte {
				return []byte(replaceOnce(t, string(good), `"keyid":"`, `"KeyID":"SHA256:other","keyid":"`))
			},
			wantErr: "letter case",
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := release.Open(context.Background(), tc.data(t), pinned.Public(), release.Policy{})
			require.Error(t, err, "a release with two readings was accepted")
			assert.Nil(t, got)
			assert.Equal(t, release.ReasonMalformed, release.ReasonOf(err), "%v", err)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}
