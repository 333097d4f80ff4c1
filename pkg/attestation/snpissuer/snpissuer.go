// Package snpissuer produces the SEV-SNP part of vTPM evidence (a vtpm.HardwareSource) on a
// confidential VM that can ask the AMD secure processor for reports itself: aws-sev-snp and
// gcp-sev-snp. Azure's variant reads the report the paravisor made instead and does not use it.
//
// Each call gets an extended report (the report plus the certificate table the host supplied)
// through go-sev-guest's QuoteProvider: configfs-tsm where the kernel has it, else the
// /dev/sev-guest ioctl. The variant chooses the 64 bytes of REPORT_DATA from the AK and the
// quote's nonce (see awssnp and gcpsnp for what each binds and why).
//
// The evidence carries the raw report and the certificates of its signing key, the VCEK or VLEK
// first. A verifier never trusts a root from here: it checks the chain against pinned AMD roots.
// With a collateral cache configured, the issuer also carries the documents a verifier without
// network would otherwise fetch (the CRL of the signing key's product line, and the VCEK when
// the host supplied none), so `constellation verify` works offline; the verifier checks them
// exactly like fetched ones.
package snpissuer

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/client"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
)

// ReportDataFunc computes the REPORT_DATA a report must carry for the AK (TPMT_PUBLIC) and
// the quote's nonce. It is the variant's binding, and its validator recomputes it.
type ReportDataFunc func(akPublic, nonce []byte) ([abi.ReportDataSize]byte, error)

// Config configures a Source.
type Config struct {
	// QuoteProvider gets extended reports; nil selects the platform's (client.GetQuoteProvider:
	// configfs-tsm, else /dev/sev-guest) when the first report is needed.
	QuoteProvider client.QuoteProvider
	// ReportData is the variant's binding. Required.
	ReportData ReportDataFunc
	// Collateral, when set, fetches the documents the evidence carries for offline verifiers
	// (the product line's CRL, and the VCEK when the host supplied none). Nil carries none.
	Collateral *collateral.Cache
}

// Source is a vtpm.HardwareSource backed by the SEV-SNP guest device. It is safe for
// concurrent use.
type Source struct {
	cfg Config

	mu sync.Mutex // guards provider
	qp client.QuoteProvider
	// find looks up the platform's quote provider (client.GetQuoteProvider).
	find func() (client.QuoteProvider, error)
}

// New returns a source.
func New(cfg Config) (*Source, error) {
	if cfg.ReportData == nil {
		return nil, errors.New("SEV-SNP hardware source: no report data binding")
	}
	return &Source{cfg: cfg, qp: cfg.QuoteProvider, find: client.GetQuoteProvider}, nil
}

// provider returns the quote provider, finding the platform's on first use (so a Source can
// be built where no guest device exists, and fails only when asked for a report).
func (s *Source) provider() (client.QuoteProvider, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.qp != nil {
		return s.qp, nil
	}
	qp, err := s.find()
	if err != nil {
		return nil, fmt.Errorf("no SEV-SNP guest device (configfs-tsm or /dev/sev-guest): %w", err)
	}
	s.qp = qp
	return qp, nil
}

// Hardware implements vtpm.HardwareSource: an extended report whose REPORT_DATA is the
// variant's binding of akPublic and nonce, with its certificates and, if configured, carried
// collateral.
func (s *Source) Hardware(ctx context.Context, akPublic, nonce []byte) (*hardwarepb.Hardware, error) {
	reportData, err := s.cfg.ReportData(akPublic, nonce)
	if err != nil {
		return nil, fmt.Errorf("SEV-SNP report data: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	qp, err := s.provider()
	if err != nil {
		return nil, err
	}
	raw, err := qp.GetRawQuote(reportData)
	if err != nil {
		return nil, fmt.Errorf("getting SEV-SNP extended report: %w", err)
	}
	ext, err := Split(raw)
	if err != nil {
		return nil, err
	}
	// A guest device that answers with a report for other data is broken; say so here,
	// where the cause is visible, not as a nonce mismatch at every verifier.
	if !bytes.Equal(ext.Report.GetReportData(), reportData[:]) {
		return nil, errors.New("SEV-SNP guest device returned a report for other REPORT_DATA")
	}
	hw := &hardwarepb.Hardware{SnpReport: ext.Raw, SnpCertificates: ext.Certificates}
	if s.cfg.Collateral != nil {
		carried, err := s.collateral(ctx, ext)
		if err != nil {
			return nil, err
		}
		hw.Collateral = carried
	}
	return hw, nil
}

// Extended is an extended report split into its parts.
type Extended struct {
	// Raw is the ATTESTATION_REPORT (abi.ReportSize bytes).
	Raw    []byte
	Report *spb.Report
	Signer abi.ReportSigner
	// Certificates holds the DER certificates of the table in chain order: the signing key's
	// certificate (VCEK or VLEK), its intermediate (ASK or ASVK), the ARK; each only if the
	// host supplied it.
	Certificates [][]byte
	// ProductLine is "Milan", "Genoa", "Turin", or "" if neither the report (version 3), the
	// table's platform information nor the signing key's certificate names it.
	ProductLine string
}

// Split parses what a QuoteProvider returns: the report, then the certificate table.
func Split(raw []byte) (*Extended, error) {
	if len(raw) < abi.ReportSize {
		return nil, fmt.Errorf("SEV-SNP extended report of %d bytes, shorter than a report (%d)", len(raw), abi.ReportSize)
	}
	report, err := abi.ReportToProto(raw[:abi.ReportSize])
	if err != nil {
		return nil, fmt.Errorf("SEV-SNP report: %w", err)
	}
	info, err := abi.ParseSignerInfo(report.GetSignerInfo())
	if err != nil {
		return nil, fmt.Errorf("SEV-SNP report signer info: %w", err)
	}
	ext := &Extended{Raw: bytes.Clone(raw[:abi.ReportSize]), Report: report, Signer: info.SigningKey}
	table := new(abi.CertTable)
	if rest := raw[abi.ReportSize:]; len(rest) > 0 {
		if err := table.Unmarshal(rest); err != nil {
			return nil, fmt.Errorf("SEV-SNP certificate table: %w", err)
		}
	}
	// Entries by GUID (not CertTable.Proto, which logs a warning for every table without an
	// endorsement key: normal where the verifier fetches the VCEK).
	entry := func(guid string) []byte {
		b, err := table.GetByGUIDString(guid)
		if err != nil {
			return nil
		}
		return b
	}
	var endorsement, intermediate []byte
	switch info.SigningKey {
	case abi.VcekReportSigner:
		endorsement, intermediate = entry(abi.VcekGUID), entry(abi.AskGUID)
	case abi.VlekReportSigner:
		endorsement = entry(abi.VlekGUID)
		// Hosts put the ASVK under the ASK's GUID (the GHCB specification has none for it);
		// some tables carry it under the zero GUID as well.
		intermediate = entry(abi.AsvkGUID)
		if intermediate == nil && isASVK(entry(abi.AskGUID)) {
			intermediate = entry(abi.AskGUID)
		}
	default:
		return nil, fmt.Errorf("SEV-SNP report signed by %s, want VCEK or VLEK", info.SigningKey)
	}
	for _, c := range [][]byte{endorsement, intermediate, entry(abi.ArkGUID)} {
		if len(c) == 0 {
			if len(ext.Certificates) == 0 {
				// No endorsement certificate: the verifier must fetch the VCEK; the
				// intermediates are pinned anyway.
				break
			}
			continue
		}
		ext.Certificates = append(ext.Certificates, c)
	}
	ext.ProductLine = productLine(report, entry(abi.ExtraPlatformInfoGUID), endorsement, info.SigningKey)
	return ext, nil
}

func isASVK(der []byte) bool {
	c, err := x509.ParseCertificate(der)
	return err == nil && strings.HasPrefix(c.Subject.CommonName, "SEV-VLEK-")
}

// productLine names the processor line, from the most to the least direct source.
func productLine(report *spb.Report, platformInfo, endorsement []byte, signer abi.ReportSigner) string {
	known := func(line string) bool { _, err := kds.ParseProductLine(line); return err == nil }
	if report.GetVersion() >= abi.ReportVersion3 {
		if line := kds.ProductLineFromFms(report.GetCpuid1EaxFms()); known(line) {
			return line
		}
	}
	if platformInfo != nil {
		if info, err := abi.ParseExtraPlatformInfo(platformInfo); err == nil {
			if line := kds.ProductLineFromFms(info.Cpuid1Eax); known(line) {
				return line
			}
		}
	}
	if cert, err := x509.ParseCertificate(endorsement); err == nil {
		if exts, err := kds.CertificateExtensions(cert, signer); err == nil {
			if line := kds.ProductLineOfProductName(exts.ProductName); known(line) {
				return line
			}
		}
	}
	return ""
}

// CRLURL returns the URL of the CRL covering the intermediate that certifies signer's
// certificates on productLine.
func CRLURL(productLine string, signer abi.ReportSigner) string {
	return kds.CrlLinkByKey(productLine, signer)
}

// VCEKURL returns the URL of the VCEK that signed report on productLine.
func VCEKURL(productLine string, report *spb.Report) string {
	return kds.VCEKCertURL(productLine, report.GetChipId(), kds.TCBVersion(report.GetReportedTcb()))
}

// collateral fetches, through the cache, what a verifier without network needs.
func (s *Source) collateral(ctx context.Context, ext *Extended) ([]*hardwarepb.Collateral, error) {
	if ext.ProductLine == "" {
		return nil, errors.New("SEV-SNP collateral: cannot tell the processor line of this report")
	}
	urls := []string{CRLURL(ext.ProductLine, ext.Signer)}
	if len(ext.Certificates) == 0 {
		if ext.Signer != abi.VcekReportSigner {
			// AMD serves VLEKs only to the cloud provider: a host that supplies none leaves
			// the report unverifiable.
			return nil, errors.New("SEV-SNP report signed by a VLEK, and the host supplied no VLEK certificate")
		}
		urls = append(urls, VCEKURL(ext.ProductLine, ext.Report))
	}
	session := s.cfg.Collateral.Session(ctx, nil)
	out := make([]*hardwarepb.Collateral, 0, len(urls))
	for _, url := range urls {
		doc, err := session.Get(url)
		if err != nil {
			return nil, fmt.Errorf("SEV-SNP collateral: %w", err)
		}
		c := &hardwarepb.Collateral{Url: url, Body: doc.Body}
		for k, v := range doc.Header {
			if len(v) > 0 {
				if c.Headers == nil {
					c.Headers = map[string]string{}
				}
				c.Headers[k] = v[0]
			}
		}
		out = append(out, c)
	}
	return out, nil
}
