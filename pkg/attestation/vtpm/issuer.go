package vtpm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// IssuerConfig configures a TPM-quote issuer.
type IssuerConfig struct {
	// Variant is written into the evidence.
	Variant variant.Variant
	// AK selects the attestation key; the zero value is AKRSA.
	AK AKAlgorithm
	// LoadAK, when set, loads a platform-provisioned attestation key instead of AK (a
	// cloud's AK at its persistent handle, or created from its template in NV).
	LoadAK func(rw io.ReadWriter) (*client.Key, error)
	// AKCertNVIndex, when nonzero, is where the platform stores the AK's certificate (a
	// cloud's index); zero means AK.CertNVIndex().
	AKCertNVIndex uint32
	// AKCert is the DER certificate of the AK. When nil, the issuer reads it from the AK's
	// NV index (AK.CertNVIndex) if the platform stored one there.
	AKCert []byte
	// EventLog, if set, returns the measurement event log to include in each evidence.
	EventLog func() ([]byte, error)
	// Hardware, if set, returns the confidential-VM evidence to include (the SEV-SNP and TDX
	// vTPM variants). It gets the AK's TPMT_PUBLIC and the quote's nonce, so the hardware
	// report can bind either.
	Hardware HardwareSource
}

// HardwareSource produces the hardware part of vTPM evidence (see IssuerConfig.Hardware).
type HardwareSource interface {
	Hardware(ctx context.Context, akPublic []byte, nonce []byte) (*hardwarepb.Hardware, error)
}

// Issuer quotes the whole SHA-256 PCR bank with an attestation key (see AKAlgorithm).
type Issuer struct {
	tpm      *TPM
	variant  variant.Variant
	ak       *client.Key
	akPublic []byte
	akCert   []byte
	eventLog func() ([]byte, error)
	hardware HardwareSource
	// pcrs are the PCR values read after the last quote and digest their SHA-256 digest in
	// quote order; read and written only inside tpm.With. See quote.
	pcrs   [][]byte
	digest []byte
}

// NewIssuer loads (or creates) the attestation key on tpm.
func NewIssuer(tpm *TPM, cfg IssuerConfig) (*Issuer, error) {
	if cfg.Variant.IsZero() {
		return nil, errors.New("issuer: no variant")
	}
	iss := &Issuer{tpm: tpm, variant: cfg.Variant, eventLog: cfg.EventLog, hardware: cfg.Hardware}
	err := tpm.With(func(rw io.ReadWriter) error {
		load, name := cfg.AK.load, cfg.AK.String()
		if cfg.LoadAK != nil {
			load, name = cfg.LoadAK, "platform"
		}
		ak, err := load(rw)
		if err != nil {
			return fmt.Errorf("loading %s attestation key: %w", name, err)
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
		idx := cfg.AK.CertNVIndex()
		if cfg.AKCertNVIndex != 0 {
			idx = cfg.AKCertNVIndex
		}
		stored, err := tpm.ReadNV(idx)
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

// AKCert returns the DER certificate of the attestation key, or nil if it has none.
func (i *Issuer) AKCert() []byte { return i.akCert }

// Issue quotes all SHA-256 PCRs with attestation.ReportData(purpose, data) as qualifying
// data: the AK never signs caller data as it is, so evidence for one purpose is never valid
// for another.
func (i *Issuer) Issue(ctx context.Context, purpose attestation.Purpose, data []byte) ([]byte, error) {
	nonce, err := attestation.ReportData(purpose, data)
	if err != nil {
		return nil, fmt.Errorf("issuing evidence: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ev := &vtpmpb.Evidence{Variant: i.variant.String(), AkPublic: i.akPublic, AkCert: i.akCert}
	err = i.tpm.With(func(rw io.ReadWriter) error {
		quote, sig, pcrs, err := i.quote(rw, nonce)
		if err != nil {
			return err
		}
		ev.Quote, ev.Signature, ev.Pcrs = quote, sig, pcrs
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
	if i.hardware != nil {
		hw, err := i.hardware.Hardware(ctx, i.akPublic, nonce)
		if err != nil {
			return nil, fmt.Errorf("hardware evidence: %w", err)
		}
		ev.Hardware = hw
	}
	return proto.Marshal(ev)
}

// quoteAttempts bounds retries when a PCR changes between the quote and the PCR read.
const quoteAttempts = 3

// quote signs all SHA-256 PCRs with nonce and returns their values.
//
// Why not client.Key.Quote: it verifies its own signature after quoting, to catch PCRs that
// changed between TPM2_Quote and the PCR read. That costs an ECDSA verify (~150 µs) on the
// critical path of every join the join service answers. Comparing the quoted PCR digest with
// the digest of the values read catches the same race for the cost of a hash; a bad signature
// is the validator's to find, as it must be anyway.
//
// The values are read once and then again only when a quote's PCR digest differs from theirs
// (a PCR was extended since): a node's PCRs rarely change after boot, and the three
// TPM2_PCR_Read commands cost three more round trips to the TPM than the quote itself. The
// values sent are always ones whose digest the TPM just signed, so the evidence is the same as
// with a fresh read.
func (i *Issuer) quote(rw io.ReadWriter, nonce []byte) (quote, sig []byte, pcrs [][]byte, err error) {
	sel := tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: allPCRs()}
	for range quoteAttempts {
		quote, sig, err = tpm2.QuoteRaw(rw, i.ak.Handle(), "", "", nonce, sel, tpm2.AlgNull)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("quote: %w", err)
		}
		attested, err := tpm2.DecodeAttestationData(quote)
		if err != nil || attested.AttestedQuoteInfo == nil {
			return nil, nil, nil, fmt.Errorf("TPM returned an undecodable quote: %v", err)
		}
		if i.digest != nil && bytes.Equal(i.digest, attested.AttestedQuoteInfo.PCRDigest) {
			return quote, sig, i.pcrs, nil
		}
		if err := i.readPCRs(rw, sel); err != nil {
			return nil, nil, nil, err
		}
		if bytes.Equal(i.digest, attested.AttestedQuoteInfo.PCRDigest) {
			return quote, sig, i.pcrs, nil
		}
		// A PCR was extended between the quote and the read: quote again.
	}
	return nil, nil, nil, fmt.Errorf("PCRs kept changing while quoting (%d attempts)", quoteAttempts)
}

// readPCRs reads the values of sel into i.pcrs and their digest in quote order into i.digest.
func (i *Issuer) readPCRs(rw io.ReadWriter, sel tpm2.PCRSelection) error {
	i.pcrs, i.digest = nil, nil
	read, err := client.ReadPCRs(rw, sel)
	if err != nil {
		return fmt.Errorf("reading PCRs: %w", err)
	}
	pcrs := make([][]byte, NumPCRs)
	h := sha256.New()
	for idx := range pcrs {
		v, ok := read.GetPcrs()[uint32(idx)]
		if !ok {
			return fmt.Errorf("TPM did not return PCR %d", idx)
		}
		pcrs[idx] = v
		h.Write(v)
	}
	i.pcrs, i.digest = pcrs, h.Sum(nil)
	return nil
}

// Close releases the attestation key handle (the persistent key stays in the TPM).
func (i *Issuer) Close() error {
	return i.tpm.With(func(io.ReadWriter) error {
		i.ak.Close()
		return nil
	})
}
