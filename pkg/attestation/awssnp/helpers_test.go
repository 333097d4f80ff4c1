package awssnp_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"io"
	"testing"

	sevtest "github.com/google/go-sev-guest/testing"
	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// otherAK returns the public key of the TPM's ECC AK: a key of the same TPM that did not sign
// the quote.
func otherAK(t testing.TB, tpm *vtpm.TPM) crypto.PublicKey {
	t.Helper()
	var pub crypto.PublicKey
	require.NoError(t, tpm.With(func(rw io.ReadWriter) error {
		k, err := client.AttestationKeyECC(rw)
		if err != nil {
			return err
		}
		defer k.Close()
		pub = k.PublicKey()
		return nil
	}))
	return pub
}

// akOf returns the AK the evidence names.
func akOf(t testing.TB, ev *vtpmpb.Evidence) crypto.PublicKey {
	t.Helper()
	pub, err := tpm2.DecodePublic(ev.AkPublic)
	require.NoError(t, err)
	key, err := pub.Key()
	require.NoError(t, err)
	return key
}

// otherKeys are the keys of another AMD: a chain no verifier pins.
func otherKeys(t testing.TB) *sevtest.AmdKeys {
	t.Helper()
	rsaKey := func() *rsa.PrivateKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		require.NoError(t, err)
		return k
	}
	ecKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		require.NoError(t, err)
		return k
	}
	ark := rsaKey()
	return &sevtest.AmdKeys{Ark: ark, Ask: ark, Asvk: ark, Vcek: ecKey(), Vlek: ecKey()}
}
