package release_test

import (
	"context"
	"crypto/ed25519"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/release"
)

// fuzzSigner is a fixed Ed25519 key (deterministic signatures), so that the seed corpus is
// the same on every run and its signed seeds pass Verify: the fuzzer starts from inputs that
// reach the statement and manifest decoders, not only the envelope parser.
func fuzzSigner(f *testing.F) *release.Signer {
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, "constellation release fuzz seed")
	s, err := release.NewSigner(ed25519.NewKeyFromSeed(seed))
	require.NoError(f, err)
	return s
}

// FuzzOpen feeds arbitrary bytes to the three checks. None may panic; whatever passes Parse
// and Verify was signed by the pinned key; a release that passes every check is refused by
// nothing when opened again (the checks are deterministic) and names its signer.
func FuzzOpen(f *testing.F) {
	s := fuzzSigner(f)
	signed, err := release.Sign(context.Background(), manifest(), s)
	require.NoError(f, err)
	f.Add(signed)
	f.Add([]byte(`{"payloadType":"application/vnd.in-toto+json","payload":"e30=","signatures":[{"keyid":"","sig":"AAAA"}]}`))
	f.Add([]byte(`{"payloadType":"application/vnd.in-toto+json","payload":"","signatures":[]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := release.Parse(data)
		if err != nil {
			require.NotZero(t, release.ReasonOf(err), "%v", err)
			return
		}
		signedRel, err := release.Verify(context.Background(), env, s.Public())
		if err != nil {
			require.NotZero(t, release.ReasonOf(err), "%v", err)
			return
		}
		got, err := signedRel.CheckPolicy(release.Policy{Running: "v1.0.0"})
		if err != nil {
			require.NotZero(t, release.ReasonOf(err), "%v", err)
			return
		}
		require.Equal(t, s.Public().KeyID(), got.KeyID())
		again, err := release.Open(context.Background(), data, s.Public(), release.Policy{Running: "v1.0.0"})
		require.NoError(t, err)
		require.Equal(t, got, again)
	})
}
