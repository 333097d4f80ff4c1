// Package snptest makes SEV-SNP evidence for tests: a fake AMD (ARK, ASK, ASVK, VCEK, VLEK
// from go-sev-guest's test signer) for any product line, reports signed by it with every
// field under the test's control, and CRLs signed by the fake ARK. Use Roots with
// snp.Config.Roots; verifiers never do.
package snptest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/binary"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	sevtest "github.com/google/go-sev-guest/testing"

	"github.com/openconstellation/constellation/pkg/attestation/snp"
)

// CPUID_1_EAX values of stepping B1 of each product line (what a version 3 report carries).
var FMS = map[string]uint32{
	snp.Milan: 0x00a00f11,
	snp.Genoa: 0x00a10f11,
	snp.Turin: 0x00b00f21,
}

// AMD is a fake AMD for one product line with one chip.
type AMD struct {
	Product string
	Signer  *sevtest.AmdSigner
	Roots   *snp.Roots
	// ChipID is the chip's CHIP_ID (the VCEK's HWID).
	ChipID [abi.ChipIDSize]byte
	// TCB is the TCB the VCEK and VLEK are certified for (reports' REPORTED_TCB).
	TCB snp.TCB
}

// Options configure NewAMD.
type Options struct {
	// TCB the endorsement keys are certified for.
	TCB snp.TCB
	// Created is when the certificates start being valid; the VCEK and VLEK expire 7 years,
	// the roots 25 years later.
	Created time.Time
	// KeyProductName overrides the product name in the VCEK (e.g. "Milan-B0" on a Genoa AMD,
	// for mismatch tests).
	KeyProductName string

	keys *sevtest.AmdKeys
}

// NewAMD returns a fake AMD for product ("Milan", "Genoa", "Turin").
func NewAMD(t testing.TB, product string, opts Options) *AMD {
	t.Helper()
	if opts.Created.IsZero() {
		opts.Created = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	a := &AMD{Product: product, TCB: opts.TCB}
	for i := range a.ChipID {
		a.ChipID[i] = byte(i + 1)
	}
	name := opts.KeyProductName
	if name == "" {
		name = product + "-B1"
	}
	if opts.keys == nil {
		opts.keys = sevtest.DefaultAmdKeys()
	}
	parts := kds.DecomposeTCBVersion(kds.TCBVersion(opts.TCB.Version(product)))
	b := &sevtest.AmdSignerBuilder{
		Keys:             opts.keys,
		ProductName:      product + "-B1",
		ArkCreationTime:  opts.Created,
		AskCreationTime:  opts.Created,
		AsvkCreationTime: opts.Created,
		VcekCreationTime: opts.Created,
		VlekCreationTime: opts.Created,
		VcekCustom:       sevtest.CertOverride{Extensions: sevtest.CustomExtensions(parts, a.ChipID[:], "", name)},
		VlekCustom:       sevtest.CertOverride{Extensions: sevtest.CustomExtensions(parts, nil, "snptest-csp", strings.SplitN(name, "-", 2)[0])},
	}
	s, err := b.TestOnlyCertChain()
	if err != nil {
		t.Fatalf("fake AMD %s: %v", product, err)
	}
	a.Signer = s
	a.Roots, err = snp.NewRoots(snp.ProductRoots{Product: product, ARK: s.Ark, ASK: s.Ask, ASVK: s.Asvk})
	if err != nil {
		t.Fatalf("fake AMD %s roots: %v", product, err)
	}
	return a
}

// CRLURL returns where the CRL covering the intermediate of signer ("VCEK" or "VLEK") is
// published (the intermediate's CRL distribution point).
func (a *AMD) CRLURL(signer string) string {
	if signer == "VLEK" {
		return a.Signer.Asvk.CRLDistributionPoints[0]
	}
	return a.Signer.Ask.CRLDistributionPoints[0]
}

// CRL returns a DER CRL signed by the fake ARK, valid from thisUpdate to nextUpdate, that
// revokes the given serial numbers.
func (a *AMD) CRL(t testing.TB, thisUpdate, nextUpdate time.Time, revoked ...*big.Int) []byte {
	t.Helper()
	tmpl := &x509.RevocationList{
		Number:             big.NewInt(1),
		ThisUpdate:         thisUpdate,
		NextUpdate:         nextUpdate,
		SignatureAlgorithm: x509.SHA384WithRSAPSS,
	}
	for _, s := range revoked {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: thisUpdate})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, a.Signer.Ark, a.Signer.Keys.Ark)
	if err != nil {
		t.Fatalf("CRL: %v", err)
	}
	return der
}

// Report are the fields of a report to sign. Report offsets follow the SEV-SNP ABI
// (ATTESTATION_REPORT).
type Report struct {
	// Version is 2 (no CPUID) or 3.
	Version uint32
	// Signer is "VCEK" or "VLEK".
	Signer      string
	Policy      abi.SnpPolicy
	VMPL        uint32
	ReportData  [64]byte
	Measurement [48]byte
	HostData    [32]byte
	IDKeyDigest [48]byte
	// AuthorKeyDigest is set (and AUTHOR_KEY_EN) if non-zero.
	AuthorKeyDigest [48]byte
	// PlatformInfo is the raw PLATFORM_INFO.
	PlatformInfo uint64
	// TCBs; zero means the AMD's TCB.
	Current, Reported, Committed, Launch *snp.TCB
	// Firmware version (current and committed).
	Major, Minor, Build uint8
	// MaskChipID zeroes CHIP_ID.
	MaskChipID bool
	// FMS overrides the CPUID of a version 3 report (default the product's).
	FMS uint32
}

// DefaultReport returns a version 3, VCEK-signed report with a realistic policy (ABI 0.31,
// SMT allowed, no debug), VMPL 0, measurement 0x11..., report data 0x22..., firmware 1.55.
func DefaultReport() Report {
	r := Report{Version: 3, Signer: "VCEK", Policy: abi.SnpPolicy{ABIMinor: 31, SMT: true}, Major: 1, Minor: 55, Build: 3, PlatformInfo: 0x3}
	for i := range r.Measurement {
		r.Measurement[i] = 0x11
	}
	for i := range r.ReportData {
		r.ReportData[i] = 0x22
	}
	return r
}

// Sign returns the raw report (abi.ReportSize bytes) signed by the AMD's VCEK or VLEK.
func (a *AMD) Sign(t testing.TB, r Report) []byte {
	t.Helper()
	signer := abi.VcekReportSigner
	if r.Signer == "VLEK" {
		signer = abi.VlekReportSigner
	}
	info := abi.SignerInfo{SigningKey: signer, AuthorKeyEn: r.AuthorKeyDigest != [48]byte{}}
	fms := uint32(0)
	if r.Version >= 3 {
		fms = FMS[a.Product]
		if r.FMS != 0 {
			fms = r.FMS
		}
	}
	arr := sevtest.CreateRawReport(&sevtest.TestReportOptions{ReportData: r.ReportData[:], SignerInfo: info, FMS: fms, Version: r.Version})
	raw := arr[:abi.ReportSize]
	// CreateRawReport sets the debug bit: write the policy the test asked for.
	binary.LittleEndian.PutUint64(raw[0x08:0x10], abi.SnpPolicyToBytes(r.Policy))
	binary.LittleEndian.PutUint32(raw[0x30:0x34], r.VMPL)
	tcb := func(p *snp.TCB) uint64 {
		if p == nil {
			return a.TCB.Version(a.Product)
		}
		return p.Version(a.Product)
	}
	binary.LittleEndian.PutUint64(raw[0x38:0x40], tcb(r.Current))
	binary.LittleEndian.PutUint64(raw[0x40:0x48], r.PlatformInfo)
	copy(raw[0x90:0xC0], r.Measurement[:])
	copy(raw[0xC0:0xE0], r.HostData[:])
	copy(raw[0xE0:0x110], r.IDKeyDigest[:])
	copy(raw[0x110:0x140], r.AuthorKeyDigest[:])
	binary.LittleEndian.PutUint64(raw[0x180:0x188], tcb(r.Reported))
	if !r.MaskChipID && signer == abi.VcekReportSigner {
		copy(raw[0x1A0:0x1E0], a.ChipID[:])
	}
	binary.LittleEndian.PutUint64(raw[0x1E0:0x1E8], tcb(r.Committed))
	raw[0x1E8], raw[0x1E9], raw[0x1EA] = r.Build, r.Minor, r.Major
	raw[0x1EC], raw[0x1ED], raw[0x1EE] = r.Build, r.Minor, r.Major
	binary.LittleEndian.PutUint64(raw[0x1F0:0x1F8], tcb(r.Launch))
	R, S, err := a.Signer.Sign(abi.SignedComponent(raw))
	if err != nil {
		t.Fatalf("signing report: %v", err)
	}
	if err := abi.SetSignature(R, S, raw); err != nil {
		t.Fatalf("signing report: %v", err)
	}
	return raw
}

// Certs returns what a host sends with a report of signer: the key's certificate and the
// chain (which validators ignore).
func (a *AMD) Certs(signer string) [][]byte {
	if signer == "VLEK" {
		return [][]byte{a.Signer.Vlek.Raw, a.Signer.Asvk.Raw, a.Signer.Ark.Raw}
	}
	return [][]byte{a.Signer.Vcek.Raw, a.Signer.Ask.Raw, a.Signer.Ark.Raw}
}

// NewAMDWithFreshKeys is NewAMD with keys of its own (every NewAMD shares go-sev-guest's
// fixed test keys): another AMD, or another chip. Its RSA keys are 2048 bits to keep tests
// fast.
func NewAMDWithFreshKeys(t testing.TB, product string, opts Options) *AMD {
	t.Helper()
	opts.keys = &sevtest.AmdKeys{}
	var err error
	for _, k := range []**rsa.PrivateKey{&opts.keys.Ark, &opts.keys.Ask, &opts.keys.Asvk} {
		if *k, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []**ecdsa.PrivateKey{&opts.keys.Vcek, &opts.keys.Vlek} {
		if *k, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	return NewAMD(t, product, opts)
}
