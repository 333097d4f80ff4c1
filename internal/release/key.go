package release

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// Release keys are ECDSA P-256 (signatures: ASN.1 DER over the SHA-256 of the DSSE PAE, as
// sigstore and go-securesystemslib sign) or Ed25519 (over the PAE itself). The key ID in an
// envelope is go-securesystemslib's dsse.SHA256KeyID of the public key (its SSH SHA256
// fingerprint): a hint only, never trusted, used to pick the verifier and word the error.

// PublicKey is a pinned release key: the only key whose signature makes a release trusted.
type PublicKey struct {
	key   crypto.PublicKey
	keyID string
}

// ParsePublicKey parses a PEM "PUBLIC KEY" block (PKIX) of an ECDSA P-256 or Ed25519 key,
// and nothing else.
func ParsePublicKey(pemData []byte) (*PublicKey, error) {
	block, rest := pem.Decode(pemData)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("release key: want one PEM PUBLIC KEY block")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("release key: data after the PEM block")
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("release key: %w", err)
	}
	return NewPublicKey(pub)
}

// NewPublicKey wraps an *ecdsa.PublicKey on P-256 or an ed25519.PublicKey.
func NewPublicKey(pub crypto.PublicKey) (*PublicKey, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("release key: ECDSA on %s, want P-256", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return nil, errors.New("release key: Ed25519 key of the wrong length")
		}
	default:
		return nil, fmt.Errorf("release key: %T, want ECDSA P-256 or Ed25519", pub)
	}
	id, err := dsse.SHA256KeyID(pub)
	if err != nil {
		return nil, fmt.Errorf("release key: %w", err)
	}
	return &PublicKey{key: pub, keyID: id}, nil
}

// KeyID is the key's ID in envelopes it signs.
func (k *PublicKey) KeyID() string { return k.keyID }

// MarshalPEM returns the key as a PEM PUBLIC KEY block, the form ParsePublicKey reads.
func (k *PublicKey) MarshalPEM() ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(k.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// verifier is the pinned key as go-securesystemslib's dsse.Verifier.
type verifier struct{ k *PublicKey }

func (v verifier) Verify(_ context.Context, data, sig []byte) error {
	switch pub := v.k.key.(type) {
	case *ecdsa.PublicKey:
		digest := sha256.Sum256(data)
		if !ecdsa.VerifyASN1(pub, digest[:], sig) {
			return errors.New("ECDSA signature does not verify")
		}
	case ed25519.PublicKey:
		if !ed25519.Verify(pub, data, sig) {
			return errors.New("Ed25519 signature does not verify")
		}
	default:
		return fmt.Errorf("unsupported key %T", pub)
	}
	return nil
}

func (v verifier) KeyID() (string, error)   { return v.k.keyID, nil }
func (v verifier) Public() crypto.PublicKey { return v.k.key }

// Signer signs releases with a private release key.
type Signer struct {
	priv crypto.Signer
	pub  *PublicKey
}

// NewSigner wraps an *ecdsa.PrivateKey on P-256 or an ed25519.PrivateKey (any crypto.Signer
// with such a public key: a KMS or HSM key too).
func NewSigner(priv crypto.Signer) (*Signer, error) {
	pub, err := NewPublicKey(priv.Public())
	if err != nil {
		return nil, err
	}
	return &Signer{priv: priv, pub: pub}, nil
}

// GenerateKey returns a new ECDSA P-256 release key (what `make` generates once for local
// releases).
func GenerateKey() (*Signer, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return NewSigner(priv)
}

// Public returns the signer's public key, the one to pin.
func (s *Signer) Public() *PublicKey { return s.pub }

// Sign implements dsse.Signer.
func (s *Signer) Sign(_ context.Context, data []byte) ([]byte, error) {
	switch s.pub.key.(type) {
	case *ecdsa.PublicKey:
		digest := sha256.Sum256(data)
		return s.priv.Sign(rand.Reader, digest[:], crypto.SHA256)
	default: // Ed25519 signs the message itself.
		return s.priv.Sign(rand.Reader, data, crypto.Hash(0))
	}
}

// KeyID implements dsse.Signer.
func (s *Signer) KeyID() (string, error) { return s.pub.keyID, nil }

// MarshalPrivatePEM returns the signer's key as a PEM "PRIVATE KEY" block (PKCS #8), the form
// ParseSigner reads: what `make` is to write once for local releases (file mode 0600, never
// committed). It fails for a signer whose key cannot be exported (a KMS or HSM key).
func (s *Signer) MarshalPrivatePEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(s.priv)
	if err != nil {
		return nil, fmt.Errorf("release key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseSigner parses a PEM "PRIVATE KEY" block (PKCS #8) of an ECDSA P-256 or Ed25519 key,
// and nothing else.
func ParseSigner(pemData []byte) (*Signer, error) {
	block, rest := pem.Decode(pemData)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("release signing key: want one PEM PRIVATE KEY block (PKCS #8)")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("release signing key: data after the PEM block")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("release signing key: %w", err)
	}
	priv, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("release signing key: %T cannot sign", key)
	}
	return NewSigner(priv)
}
