package azure

import (
	"crypto"
	"crypto/rsa"
	"encoding/base64"
	"fmt"
	"math/big"
	"strings"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// Key IDs of the JWKs in the runtime data.
const (
	KeyIDAK = "HCLAkPub"
	KeyIDEK = "HCLEkPub"
)

// RuntimeData is the parsed runtime data of an HCL report.
type RuntimeData struct {
	// AK is the vTPM's attestation key (JWK "HCLAkPub").
	AK *rsa.PublicKey
	// EK is the vTPM's endorsement key (JWK "HCLEkPub"), nil when the runtime data has none
	// (older HCLs list the AK only).
	EK *rsa.PublicKey
	// VMConfig is the VM configuration the HCL reports.
	VMConfig VMConfiguration
}

// VMConfiguration is the runtime data's "vm-configuration": what the HCL says about the VM.
type VMConfiguration struct {
	ConsoleEnabled bool   `json:"console-enabled"`
	SecureBoot     bool   `json:"secure-boot"`
	TPMEnabled     bool   `json:"tpm-enabled"`
	VMUniqueID     string `json:"vmUniqueId"`
}

type runtimeDataJSON struct {
	Keys     []jwk            `json:"keys"`
	VMConfig *VMConfiguration `json:"vm-configuration"`
}

type jwk struct {
	Kid string `json:"kid"`
	Kty string `json:"kty"`
	N   string `json:"n"`
	E   string `json:"e"`
}

// minRSABits is the smallest RSA key the runtime data may name (vTPM keys are RSA-2048).
const minRSABits = 2048

// ParseRuntimeData parses the runtime data of an HCL report. The AK must be present exactly
// once; keys are decoded as keys (modulus and exponent as numbers), so two encodings of one
// key (an exponent with leading zero bytes, say) compare equal. Errors wrap
// attestation.ErrMalformed.
func ParseRuntimeData(b []byte) (*RuntimeData, error) {
	rd, err := parseRuntimeData(b)
	if err != nil {
		return nil, fmt.Errorf("%w: HCL runtime data: %w", attestation.ErrMalformed, err)
	}
	return rd, nil
}

func parseRuntimeData(b []byte) (*RuntimeData, error) {
	if len(b) > maxRuntimeDataLen {
		return nil, fmt.Errorf("%d bytes, limit %d", len(b), maxRuntimeDataLen)
	}
	// The HCL may add fields (it has: "user-data", "current-time"); a field twice or in
	// other letter case is refused, so that the AK read here is the one every reader sees.
	var doc runtimeDataJSON
	if err := strictjson.UnmarshalIgnoreUnknown(b, &doc); err != nil {
		return nil, fmt.Errorf("JSON: %w", err)
	}
	if doc.VMConfig == nil {
		return nil, fmt.Errorf("no vm-configuration")
	}
	out := &RuntimeData{VMConfig: *doc.VMConfig}
	for i, k := range doc.Keys {
		var dst **rsa.PublicKey
		switch k.Kid {
		case KeyIDAK:
			dst = &out.AK
		case KeyIDEK:
			dst = &out.EK
		default:
			continue
		}
		if *dst != nil {
			return nil, fmt.Errorf("key %q listed twice", k.Kid)
		}
		key, err := k.rsaKey()
		if err != nil {
			return nil, fmt.Errorf("keys[%d] (%s): %w", i, k.Kid, err)
		}
		*dst = key
	}
	if out.AK == nil {
		return nil, fmt.Errorf("no key %q", KeyIDAK)
	}
	return out, nil
}

func (k jwk) rsaKey() (*rsa.PublicKey, error) {
	if k.Kty != "RSA" {
		return nil, fmt.Errorf("key type %q, want RSA", k.Kty)
	}
	n, err := decodeBase64URL(k.N)
	if err != nil {
		return nil, fmt.Errorf("modulus: %w", err)
	}
	e, err := decodeBase64URL(k.E)
	if err != nil {
		return nil, fmt.Errorf("exponent: %w", err)
	}
	mod := new(big.Int).SetBytes(n)
	if mod.BitLen() < minRSABits {
		return nil, fmt.Errorf("modulus of %d bits, want at least %d", mod.BitLen(), minRSABits)
	}
	exp := new(big.Int).SetBytes(e)
	// crypto/rsa verifies with exponents up to 2^31-1 only; 65537 is what TPMs use.
	if !exp.IsInt64() || exp.Int64() < 3 || exp.Int64() > 1<<31-1 || exp.Bit(0) == 0 {
		return nil, fmt.Errorf("exponent %s, want an odd number in 3..2^31-1", exp)
	}
	return &rsa.PublicKey{N: mod, E: int(exp.Int64())}, nil
}

// decodeBase64URL decodes base64url with or without padding (JWKs have none, but the HCL's
// encoder is not specified).
func decodeBase64URL(s string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("empty")
	}
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

// CheckAK checks that ak (the key that signed the vTPM quote) is the runtime data's AK, so
// the quote comes from the vTPM of the VM the hardware report describes. Errors wrap
// attestation.ErrUntrustedSigner.
func (rd *RuntimeData) CheckAK(ak crypto.PublicKey) error {
	if !rd.AK.Equal(ak) {
		return fmt.Errorf("%w: the quote's AK is not the AK (%s) of the HCL report's runtime data: the hardware report is of another VM or vTPM", attestation.ErrUntrustedSigner, KeyIDAK)
	}
	return nil
}

// AKPublic returns the TPMT_PUBLIC encoding of the runtime data's AK (JWK "HCLAkPub") as the
// Azure vTPM holds it: an RSA-2048 restricted signing key (RSASSA with SHA-256) that never
// leaves the TPM (fixedTPM, fixedParent, sensitiveDataOrigin). It is what evidence of this
// module carries as its AK (vtpmpb.Evidence.ak_public) and what go-tpm's quote verification
// takes (tpm2.DecodePublic, then Key), for a relying party that assembles evidence from an
// HCL report and a quote it got itself. The runtime data is what names the key: check it is
// bound to a verified hardware report (HCLReport.CheckBinding, then the report's check)
// before trusting the key.
func (rd *RuntimeData) AKPublic() ([]byte, error) {
	if rd.AK == nil {
		return nil, fmt.Errorf("runtime data has no AK (%s)", KeyIDAK)
	}
	if bits := rd.AK.N.BitLen(); bits != 2048 {
		return nil, fmt.Errorf("runtime data's AK is RSA-%d, the Azure vTPM's AK is RSA-2048", bits)
	}
	exponent := uint32(rd.AK.E)
	if rd.AK.E == 65537 {
		exponent = 0 // TPM encoding of the default exponent
	}
	pub := tpm2.Public{
		Type:    tpm2.AlgRSA,
		NameAlg: tpm2.AlgSHA256,
		Attributes: tpm2.FlagFixedTPM | tpm2.FlagFixedParent | tpm2.FlagSensitiveDataOrigin |
			tpm2.FlagUserWithAuth | tpm2.FlagNoDA | tpm2.FlagRestricted | tpm2.FlagSign,
		RSAParameters: &tpm2.RSAParams{
			Sign:        &tpm2.SigScheme{Alg: tpm2.AlgRSASSA, Hash: tpm2.AlgSHA256},
			KeyBits:     2048,
			ExponentRaw: exponent,
			ModulusRaw:  rd.AK.N.Bytes(),
		},
	}
	return pub.Encode()
}

// RSAJWK encodes key as the runtime data's JWKs do, for issuers' tests and tools that write
// runtime data.
func RSAJWK(kid string, key *rsa.PublicKey) map[string]any {
	return map[string]any{
		"kid":     kid,
		"kty":     "RSA",
		"key_ops": []string{"sign"},
		"n":       base64.RawURLEncoding.EncodeToString(key.N.Bytes()),
		"e":       base64.RawURLEncoding.EncodeToString(big.NewInt(int64(key.E)).Bytes()),
	}
}
