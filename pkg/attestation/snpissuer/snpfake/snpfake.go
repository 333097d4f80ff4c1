// Package snpfake is a fake AMD secure processor for tests: it signs realistic SEV-SNP
// reports for any REPORT_DATA with a test-only AMD chain built by go-sev-guest's
// testing.AmdSignerBuilder (Milan, Genoa or Turin; VCEK or VLEK), and serves them through
// go-sev-guest's client.QuoteProvider interface, as configfs-tsm does on a real guest.
//
// Only tests import it: its keys are go-sev-guest's published test keys.
package snpfake

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/client"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	sevtest "github.com/google/go-sev-guest/testing"

	"github.com/openconstellation/constellation/pkg/attestation/snp"
)

// Options describe one fake platform (one chip, one guest).
type Options struct {
	// ProductName is the VCEK's product name: "Milan-B0", "Genoa-B1", "Turin-B0", ...
	ProductName string
	// Signer is abi.VcekReportSigner (the default) or abi.VlekReportSigner.
	Signer abi.ReportSigner
	// Now is when the chain is created (certificates are valid from then).
	Now time.Time
	// Chip distinguishes chips: it seeds CHIP_ID (VCEK reports; VLEK reports mask it).
	Chip byte
	// Measurement is the launch measurement (48 bytes); zero if nil.
	Measurement []byte
	// TCB is the reported, committed, current and launch TCB; Default TCB if zero.
	TCB kds.TCBParts
	// ReportVersion is 3 (with CPUID, the default) or 2.
	ReportVersion uint32
	// OmitCertificates makes the host supply no certificate table (as on platforms where the
	// verifier fetches the VCEK).
	OmitCertificates bool
	// Keys default to go-sev-guest's test keys (one fake AMD for all platforms).
	Keys *sevtest.AmdKeys
}

// DefaultTCB is a realistic TCB (Milan firmware of 2024).
var DefaultTCB = kds.TCBParts{BlSpl: 4, TeeSpl: 0, SnpSpl: 22, UcodeSpl: 213}

// TurinFMC is the FMC security patch level of fake Turin platforms.
const TurinFMC = 1

// Policy is the guest policy of the fake's reports: SMT allowed, no debug, no migration agent
// (what AWS and GCP launch).
var Policy = abi.SnpPolicyToBytes(abi.SnpPolicy{SMT: true})

// Platform is one fake chip with its guest.
type Platform struct {
	Signer      *sevtest.AmdSigner
	Product     *spb.SevProduct
	ProductLine string
	ChipID      [abi.ChipIDSize]byte

	opts Options
	tcb  kds.TCBVersion

	mu      sync.Mutex
	reports int
}

// New builds a platform and its test-only AMD chain.
func New(opts Options) (*Platform, error) {
	if opts.ProductName == "" {
		opts.ProductName = "Milan-B0"
	}
	if opts.Signer != abi.VlekReportSigner {
		opts.Signer = abi.VcekReportSigner
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	if opts.ReportVersion == 0 {
		opts.ReportVersion = 3
	}
	if opts.TCB == (kds.TCBParts{}) {
		opts.TCB = DefaultTCB
	}
	product, err := kds.ParseProductName(opts.ProductName, abi.VcekReportSigner)
	if err != nil {
		return nil, err
	}
	parts := opts.TCB
	if kds.ProductLine(product) == "Turin" {
		// Turin moved the TCB fields to make room for FMC (byte 0): bootloader, TEE and SNP
		// in bytes 1..3, microcode in byte 7. go-sev-guest composes the certificate's TCB in
		// the older layout, so place the Turin fields where its bytes land.
		parts = kds.TCBParts{BlSpl: TurinFMC, TeeSpl: opts.TCB.BlSpl, Spl4: opts.TCB.TeeSpl, Spl5: opts.TCB.SnpSpl, UcodeSpl: opts.TCB.UcodeSpl}
	}
	tcb, err := kds.ComposeTCBParts(parts)
	if err != nil {
		return nil, err
	}
	p := &Platform{Product: product, ProductLine: kds.ProductLine(product), opts: opts, tcb: tcb}
	if opts.Signer == abi.VcekReportSigner {
		for i := range p.ChipID {
			p.ChipID[i] = opts.Chip ^ byte(i)
		}
	}
	keys := opts.Keys
	if keys == nil {
		keys = sevtest.DefaultAmdKeys()
	}
	created := opts.Now.Add(-time.Hour)
	b := &sevtest.AmdSignerBuilder{
		Keys:             keys,
		ProductName:      opts.ProductName,
		CSPID:            "fake-cloud",
		ArkCreationTime:  created,
		AskCreationTime:  created,
		AsvkCreationTime: created,
		VcekCreationTime: created,
		VlekCreationTime: created,
		HWID:             p.ChipID,
		TCB:              tcb,
		// The builder's endorsement certificates carry TCB 0 unless told: give them the
		// platform's, as AMD's do.
		VcekCustom: sevtest.CertOverride{Extensions: sevtest.CustomExtensions(parts, p.ChipID[:], "", opts.ProductName)},
		VlekCustom: sevtest.CertOverride{Extensions: sevtest.CustomExtensions(parts, nil, "fake-cloud", opts.ProductName)},
	}
	signer, err := b.TestOnlyCertChain()
	if err != nil {
		return nil, err
	}
	signer.Product = product
	p.Signer = signer
	return p, nil
}

// Endorsement returns the certificate of the key that signs the platform's reports.
func (p *Platform) Endorsement() *x509.Certificate {
	if p.opts.Signer == abi.VlekReportSigner {
		return p.Signer.Vlek
	}
	return p.Signer.Vcek
}

// Intermediate returns the ASK (VCEK) or ASVK (VLEK).
func (p *Platform) Intermediate() *x509.Certificate {
	if p.opts.Signer == abi.VlekReportSigner {
		return p.Signer.Asvk
	}
	return p.Signer.Ask
}

// ReportProto returns the unsigned report the platform makes for reportData: edit it and
// pass it to Sign to forge variations.
func (p *Platform) ReportProto(reportData [abi.ReportDataSize]byte) *spb.Report {
	p.mu.Lock()
	p.reports++
	n := p.reports
	p.mu.Unlock()
	measurement := make([]byte, abi.MeasurementSize)
	copy(measurement, p.opts.Measurement)
	reportID := make([]byte, abi.ReportIDSize)
	reportID[0], reportID[1] = p.opts.Chip, byte(n)
	return &spb.Report{
		Version:         p.opts.ReportVersion,
		GuestSvn:        1,
		Policy:          Policy,
		FamilyId:        make([]byte, abi.FamilyIDSize),
		ImageId:         make([]byte, abi.ImageIDSize),
		Vmpl:            0,
		SignatureAlgo:   abi.SignEcdsaP384Sha384,
		CurrentTcb:      uint64(p.tcb),
		PlatformInfo:    1, // SMT enabled
		SignerInfo:      abi.ComposeSignerInfo(abi.SignerInfo{SigningKey: p.opts.Signer, MaskChipKey: p.opts.Signer == abi.VlekReportSigner}),
		ReportData:      reportData[:],
		Measurement:     measurement,
		HostData:        make([]byte, abi.HostDataSize),
		IdKeyDigest:     make([]byte, abi.IDKeyDigestSize),
		AuthorKeyDigest: make([]byte, abi.AuthorKeyDigestSize),
		ReportId:        reportID,
		ReportIdMa:      make([]byte, abi.ReportIDMASize),
		ReportedTcb:     uint64(p.tcb),
		Cpuid1EaxFms:    abi.MaskedCpuid1EaxFromSevProduct(p.Product),
		ChipId:          p.ChipID[:],
		CommittedTcb:    uint64(p.tcb),
		CurrentBuild:    29,
		CurrentMinor:    55,
		CurrentMajor:    1,
		CommittedBuild:  29,
		CommittedMinor:  55,
		CommittedMajor:  1,
		LaunchTcb:       uint64(p.tcb),
		Signature:       make([]byte, abi.SignatureSize),
	}
}

// Sign encodes report and signs it with the platform's endorsement key.
func (p *Platform) Sign(report *spb.Report) ([]byte, error) {
	raw, err := abi.ReportToAbiBytes(report)
	if err != nil {
		return nil, err
	}
	r, s, err := p.Signer.Sign(abi.SignedComponent(raw))
	if err != nil {
		return nil, err
	}
	if err := abi.SetSignature(r, s, raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// Report returns a signed report for reportData.
func (p *Platform) Report(reportData [abi.ReportDataSize]byte) ([]byte, error) {
	return p.Sign(p.ReportProto(reportData))
}

// CertTable returns the certificate table the host supplies with extended reports, with the
// platform information entry configfs-tsm adds.
func (p *Platform) CertTable() ([]byte, error) {
	var table []byte
	if !p.opts.OmitCertificates {
		t, err := p.Signer.CertTableBytes()
		if err != nil {
			return nil, err
		}
		table = t
	}
	if table == nil {
		// An empty table: only the terminator, so the platform entry can be added.
		table = make([]byte, abi.CertTableEntrySize)
	}
	return abi.ExtendPlatformCertTable(table, &abi.ExtraPlatformInfo{
		Size:      abi.ExtraPlatformInfoV0Size,
		Cpuid1Eax: abi.MaskedCpuid1EaxFromSevProduct(p.Product),
	})
}

// CRLURL is where AMD publishes the CRL for the platform's intermediate.
func (p *Platform) CRLURL() string { return kds.CrlLinkByKey(p.ProductLine, p.opts.Signer) }

// VCEKURL is where AMD serves the platform's VCEK.
func (p *Platform) VCEKURL() string {
	return kds.VCEKCertURL(p.ProductLine, p.ChipID[:], p.tcb)
}

// CRL returns a DER CRL signed by the fake ARK, valid from thisUpdate to nextUpdate,
// revoking the given serial numbers.
func (p *Platform) CRL(thisUpdate, nextUpdate time.Time, revoked ...*big.Int) ([]byte, error) {
	var entries []x509.RevocationListEntry
	for _, sn := range revoked {
		entries = append(entries, x509.RevocationListEntry{SerialNumber: sn, RevocationTime: thisUpdate})
	}
	return x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number:                    big.NewInt(1),
		ThisUpdate:                thisUpdate,
		NextUpdate:                nextUpdate,
		RevokedCertificateEntries: entries,
		Issuer:                    pkix.Name{CommonName: p.Signer.Ark.Subject.CommonName},
	}, p.Signer.Ark, p.Signer.Keys.Ark)
}

// QuoteProvider returns the platform as a go-sev-guest QuoteProvider.
func (p *Platform) QuoteProvider() client.QuoteProvider { return quoteProvider{p} }

type quoteProvider struct{ p *Platform }

func (q quoteProvider) IsSupported() bool { return true }

func (q quoteProvider) Product() *spb.SevProduct { return q.p.Product }

func (q quoteProvider) GetRawQuote(reportData [abi.ReportDataSize]byte) ([]byte, error) {
	report, err := q.p.Report(reportData)
	if err != nil {
		return nil, fmt.Errorf("fake SEV-SNP: %w", err)
	}
	table, err := q.p.CertTable()
	if err != nil {
		return nil, fmt.Errorf("fake SEV-SNP: %w", err)
	}
	return append(report, table...), nil
}

// Failing is a QuoteProvider whose device fails every request.
type Failing struct{}

// IsSupported implements client.QuoteProvider.
func (Failing) IsSupported() bool { return true }

// Product implements client.QuoteProvider.
func (Failing) Product() *spb.SevProduct { return abi.DefaultSevProduct() }

// GetRawQuote implements client.QuoteProvider.
func (Failing) GetRawQuote([abi.ReportDataSize]byte) ([]byte, error) {
	return nil, errors.New("input/output error")
}

// Roots returns the fake AMD chain of the platform's product line, for snp.Config.Roots.
func (p *Platform) Roots() snp.ProductRoots {
	return snp.ProductRoots{Product: p.ProductLine, ARK: p.Signer.Ark, ASK: p.Signer.Ask, ASVK: p.Signer.Asvk}
}
