package tdx

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/google/go-tdx-guest/client"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// QuoteProvider gets a TD quote over 64 bytes of report data: go-tdx-guest's quote
// provider interface. In a TD it is configfs-tsm (NewConfigFSQuoteProvider); tests use fakes.
type QuoteProvider = client.QuoteProvider

// NewConfigFSQuoteProvider returns the quote provider of a Linux TD: the kernel's
// configfs-tsm report interface (/sys/kernel/config/tsm/report), through
// github.com/google/go-configfs-tsm.
func NewConfigFSQuoteProvider() (QuoteProvider, error) {
	return client.GetQuoteProvider()
}

// Issuer issues qemu-tdx evidence: a TD quote whose REPORTDATA is
// attestation.ReportData(purpose, data) || 0^32, in a hardwarepb.TDX message.
type Issuer struct {
	provider QuoteProvider
	cache    *collateral.Cache
	// root is nil in production (the pinned Intel root); see VerifyOptions.root.
	root *x509.Certificate
}

var _ attestation.Issuer = (*Issuer)(nil)

// NewIssuer returns an issuer getting quotes from provider. With a collateral cache, the
// evidence also carries the collateral its verification needs (TCB info, QE identity,
// CRLs), so that a verifier without network can check it; nil attaches none.
func NewIssuer(provider QuoteProvider, cache *collateral.Cache) (*Issuer, error) {
	if provider == nil {
		return nil, errors.New("TDX issuer: no quote provider")
	}
	return &Issuer{provider: provider, cache: cache}, nil
}

// Variant implements attestation.Issuer.
func (i *Issuer) Variant() variant.Variant { return Variant }

// Issue implements attestation.Issuer.
func (i *Issuer) Issue(ctx context.Context, purpose attestation.Purpose, data []byte) ([]byte, error) {
	reportData, err := ReportDataFor(purpose, data)
	if err != nil {
		return nil, fmt.Errorf("TDX issuer: %w", err)
	}
	// Getting a quote goes through the host's quoting enclave and can take long; the
	// provider takes no context, so the call runs aside and the caller's context bounds
	// the wait.
	type result struct {
		quote []byte
		err   error
	}
	done := make(chan result, 1)
	go func() {
		quote, err := client.GetRawQuote(i.provider, reportData)
		done <- result{quote, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("TDX issuer: getting a quote: %w", ctx.Err())
	}
	if res.err != nil {
		return nil, fmt.Errorf("TDX issuer: getting a quote: %w", res.err)
	}
	// Check what the provider returned before sending it: a quote over other report data
	// (a stale or misrouted one) would only fail at the verifier, with a less useful error.
	quote, err := ParseQuote(res.quote)
	if err != nil {
		return nil, fmt.Errorf("TDX issuer: quote provider returned: %w", err)
	}
	if got := quote.GetTdQuoteBody().GetReportData(); !bytes.Equal(got, reportData[:]) {
		return nil, fmt.Errorf("TDX issuer: quote provider returned a quote over REPORTDATA %x, asked for %x", got, reportData)
	}
	// Send the signed part only: providers may pad the quote to their buffer size.
	raw := res.quote
	if end := signedEnd(quote); end <= len(raw) {
		raw = raw[:end]
	}
	msg := &hardwarepb.TDX{Variant: Variant.String(), Quote: raw}
	if i.cache != nil {
		msg.Collateral = i.collateral(ctx, quote)
	}
	evidence, err := proto.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("TDX issuer: encoding evidence: %w", err)
	}
	return evidence, nil
}

// signedEnd returns the length of the signed part of a version 4 quote: header, TD quote
// body, the signed-data size field and the signed data.
func signedEnd(q *pb.QuoteV4) int {
	return signedDataOffset + int(q.GetSignedDataSize())
}

// collateral returns the documents a verifier of quote reads (collateralURLs), those the
// node's cache has or can fetch; a document that cannot be had is simply not attached (the
// verifier fetches it, or decides by its revocation policy).
func (i *Issuer) collateral(ctx context.Context, quote *pb.QuoteV4) []*hardwarepb.Collateral {
	urls, err := collateralURLs(quote, rootOrPinned(i.root))
	if err != nil {
		return nil
	}
	session := i.cache.Session(ctx, nil)
	var docs []*hardwarepb.Collateral
	for _, url := range urls {
		doc, err := session.Get(url)
		if err != nil {
			continue
		}
		c := &hardwarepb.Collateral{Url: url, Body: doc.Body, Headers: map[string]string{}}
		for name, values := range doc.Header {
			if len(values) == 1 {
				c.Headers[name] = values[0]
			}
		}
		docs = append(docs, c)
	}
	return docs
}
