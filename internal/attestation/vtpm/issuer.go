package vtpm

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/internal/attestation"
	"github.com/openconstellation/constellation/internal/attestation/variant"
)

// IssuerConfig configures a TPM-quote issuer.
type IssuerConfig struct {
	// Variant is written into the evidence.
	Variant variant.Variant
	// AKCert is the DER certificate of the AK. When nil, the issuer reads it from
	// AKCertNVIndex if the platform stored one there.
	AKCert []byte
	// EventLog, if set, returns the measurement event log to include in each evidence.
	EventLog func() ([]byte, error)
}

// Issuer quotes the whole SHA-256 PCR bank with an RSA-2048 attestation key.
//
// Why RSA-2048: verification is what scales with cluster size (a join service validates
// every node, every connection), and on our machines an RSA-2048 PKCS#1 v1.5 verify costs
// ~45 µs against ~105 µs for ECDSA P-256. Quoting costs about the same either way (~0.7 ms
// on the simulator). The AK is a primary key under the owner hierarchy made persistent at
// client.DefaultAKRSAHandle, so it is created once per TPM and is stable across restarts:
// the platform can certify it once.
type Issuer struct {
	tpm      *TPM
	variant  variant.Variant
	ak       *client.Key
	akPublic []byte
	akCert   []byte
	eventLog func() ([]byte, error)
}

// NewIssuer loads (or creates) the attestation key on tpm.
func NewIssuer(tpm *TPM, cfg IssuerConfig) (*Issuer, error) {
	if cfg.Variant.IsZero() {
		return nil, errors.New("issuer: no variant")
	}
	iss := &Issuer{tpm: tpm, variant: cfg.Variant, eventLog: cfg.EventLog}
	err := tpm.With(func(rw io.ReadWriter) error {
		ak, err := client.AttestationKeyRSA(rw)
		if err != nil {
			return fmt.Errorf("loading attestation key: %w", err)
		}
		pub, err := ak.PublicArea().Encode()
		if err != nil {
			ak.Close()
			return fmt.Errorf("encoding attestation key: %w", err)
		}
		iss.ak, iss.akPublic = ak, pub
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("issuer on %s: %w", tpm, err)
	}
	cert := cfg.AKCert
	if cert == nil {
		stored, err := tpm.ReadNV(AKCertNVIndex)
		switch {
		case errors.Is(err, ErrNVNotDefined):
		case err != nil:
			return nil, fmt.Errorf("issuer: reading AK certificate: %w", err)
		default:
			cert = stored
		}
	}
	if cert != nil {
		parsed, err := x509.ParseCertificate(cert)
		if err != nil {
			return nil, fmt.Errorf("issuer: AK certificate: %w", err)
		}
		// Refuse to ship a certificate for another key: the validator would reject every
		// evidence, and the cause would be much harder to find there.
		if err := iss.ak.SetCert(parsed); err != nil {
			return nil, fmt.Errorf("issuer: AK certificate: %w", err)
		}
		iss.akCert = cert
	}
	return iss, nil
}

// Variant returns the variant this issuer writes into its evidence.
func (i *Issuer) Variant() variant.Variant { return i.variant }

// AKPublic returns the TPMT_PUBLIC encoding of the attestation key.
func (i *Issuer) AKPublic() []byte { return i.akPublic }

// Issue quotes all SHA-256 PCRs with nonce as qualifying data.
func (i *Issuer) Issue(ctx context.Context, nonce []byte) ([]byte, error) {
	if len(nonce) < attestation.MinNonceSize || len(nonce) > attestation.MaxNonceSize {
		return nil, fmt.Errorf("nonce of %d bytes: want %d..%d", len(nonce), attestation.MinNonceSize, attestation.MaxNonceSize)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ev := &vtpmpb.Evidence{Variant: i.variant.String(), AkPublic: i.akPublic, AkCert: i.akCert}
	err := i.tpm.With(func(io.ReadWriter) error {
		q, err := i.ak.Quote(tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: allPCRs()}, nonce)
		if err != nil {
			return err
		}
		ev.Quote, ev.Signature = q.GetQuote(), q.GetRawSig()
		ev.Pcrs = make([][]byte, NumPCRs)
		for i := range ev.Pcrs {
			v, ok := q.GetPcrs().GetPcrs()[uint32(i)]
			if !ok {
				return fmt.Errorf("TPM did not return PCR %d", i)
			}
			ev.Pcrs[i] = v
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("quoting on %s: %w", i.tpm, err)
	}
	if i.eventLog != nil {
		log, err := i.eventLog()
		if err != nil {
			return nil, fmt.Errorf("reading event log: %w", err)
		}
		ev.EventLog = log
	}
	return proto.Marshal(ev)
}

// Close releases the attestation key handle (the persistent key stays in the TPM).
func (i *Issuer) Close() error {
	return i.tpm.With(func(io.ReadWriter) error {
		i.ak.Close()
		return nil
	})
}
