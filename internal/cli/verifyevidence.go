package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/strictjson"
	"github.com/openconstellation/constellation/pkg/untrusted"
	"github.com/openconstellation/constellation/pkg/verify"
)

// evidenceOptions are the flags of verify-evidence.
type evidenceOptions struct {
	variant        string
	reference      string
	reportData     string
	nonce          string
	revocation     string
	collateral     string
	saveCollateral string
	offline        bool
	listCollateral bool
	at             string
	output         string
	timeout        time.Duration
}

func newVerifyEvidenceCmd() *cobra.Command {
	var o evidenceOptions
	cmd := &cobra.Command{
		Use:   "verify-evidence FILE",
		Short: "Verify attestation evidence from a file against a reference, without a cluster",
		Long: `Verify evidence of one variant that someone else obtained (a key broker, an auditor):
parse it, verify its signatures, chains and collateral, check it is bound to your report data,
and match it against the reference (the JSON of a choose.Reference, as
kube-system/constellation-attestation holds it). Prints the verified claims.

FILE is the evidence as the variant encodes it, or the JSON a verification service's HTTP
endpoint returns ({"variant": ..., "evidence": base64}); "-" reads standard input.

The binding is one of:
  --report-data HEX   the evidence's binding field (a TPM quote's qualifying data, a TD
                      quote's REPORTDATA zero-padded to 64 bytes) is exactly these bytes:
                      your own nonce scheme;
  --nonce HEX         the evidence is a Constellation verification service's answer to this
                      nonce (ReportData("verify", nonce)).

Collateral (AMD's and Intel's CRLs, VCEKs, TCB info): fetched over HTTPS unless --offline;
--collateral FILE loads a bundle a previous run saved with --save-collateral (on a machine
with network), --list-collateral prints the URLs the check reads and exits. Without a
current CRL the revocation status is unknown, which fails unless
--revocation unknown-accepted (the claims then say revocation was not checked); a forged
report fails as forged either way. --at checks certificates and collateral at a given
time (RFC 3339) instead of now.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.output != "text" && o.output != "json" {
				return fmt.Errorf("--output %q: want text or json", o.output)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return runVerifyEvidence(ctx, cmd.OutOrStdout(), cmd.InOrStdin(), args[0], o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.variant, "variant", "", "the evidence's attestation variant (required), e.g. azure-sev-snp")
	f.StringVar(&o.reference, "reference", "", "file with the reference (choose.Reference JSON) to check against (required)")
	f.StringVar(&o.reportData, "report-data", "", "hex: the evidence must be bound to exactly these bytes (your own scheme)")
	f.StringVar(&o.nonce, "nonce", "", "hex: the evidence is a verification service's answer to this nonce")
	f.StringVar(&o.revocation, "revocation", attestation.RevocationRequired.String(), "what an unknown revocation status means: required (fail) or unknown-accepted")
	f.StringVar(&o.collateral, "collateral", "", "load collateral from this bundle (saved by --save-collateral)")
	f.StringVar(&o.saveCollateral, "save-collateral", "", "write the collateral fetched during this run to this bundle, for an offline verifier")
	f.BoolVar(&o.offline, "offline", false, "never fetch collateral: use only --collateral and what the evidence carries")
	f.BoolVar(&o.listCollateral, "list-collateral", false, "print the URLs of the collateral the check reads, and exit")
	f.StringVar(&o.at, "at", "", "check at this time (RFC 3339) instead of now")
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	f.DurationVar(&o.timeout, "timeout", time.Minute, "give up after this long")
	return cmd
}

// evidenceClaims is the -o json output of verify-evidence.
type evidenceClaims struct {
	verify.Claims
	// ReportData is the binding the evidence was checked against (hex).
	ReportData string `json:"reportData"`
	// Revocation is the policy the check ran with.
	Revocation string `json:"revocation"`
}

func runVerifyEvidence(ctx context.Context, out io.Writer, in io.Reader, file string, o evidenceOptions) error {
	v, err := variant.FromString(o.variant)
	if err != nil {
		return fmt.Errorf("--variant: %w", err)
	}
	evidence, err := readEvidence(file, in, v)
	if err != nil {
		return err
	}
	policy, err := attestation.ParseRevocationPolicy(o.revocation)
	if err != nil {
		return fmt.Errorf("--revocation: %w", err)
	}
	now := time.Now
	if o.at != "" {
		at, err := time.Parse(time.RFC3339, o.at)
		if err != nil {
			return fmt.Errorf("--at: %w", err)
		}
		now = func() time.Time { return at }
	}
	cache, recorder, err := evidenceCollateral(o, now)
	if err != nil {
		return err
	}
	validator, err := evidenceValidator(o, v, cache, now, policy)
	if err != nil {
		return err
	}
	if o.listCollateral {
		urls, err := attestation.CollateralURLs(validator, evidence)
		if err != nil {
			return fmt.Errorf("listing collateral: %w", err)
		}
		for _, u := range urls {
			fmt.Fprintln(out, u)
		}
		return nil
	}
	reportData, err := evidenceBinding(o)
	if err != nil {
		return err
	}
	verified, verr := attestation.ValidateReportData(ctx, validator, evidence, reportData)
	if recorder != nil {
		if err := saveBundle(o.saveCollateral, recorder.Bundle()); err != nil {
			return err
		}
	}
	if verr != nil {
		return fmt.Errorf("evidence refused (%s): %w", attestation.Reason(verr), verr)
	}
	return printEvidenceClaims(out, o.output, evidenceClaims{Claims: verify.ClaimsOf(verified), ReportData: hex.EncodeToString(reportData), Revocation: policy.String()})
}

// maxEvidenceFile bounds what verify-evidence reads (evidence is at most
// attestation.DefaultMaxEvidenceSize; base64 and JSON add a third).
const maxEvidenceFile = 2 * attestation.DefaultMaxEvidenceSize

// readEvidence reads FILE ("-": in): the variant's encoding, or a verification service's
// HTTP answer, whose variant must be v.
func readEvidence(file string, in io.Reader, v variant.Variant) ([]byte, error) {
	r := in
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxEvidenceFile+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	if len(data) > maxEvidenceFile {
		return nil, fmt.Errorf("%s: more than %d bytes: not evidence", file, maxEvidenceFile)
	}
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '{' {
		var answer struct {
			Variant  string `json:"variant"`
			Evidence string `json:"evidence"`
		}
		// One answer, each field once in its exact spelling: encoding/json alone read the
		// first of two answers and the last of two "evidence" fields.
		if err := strictjson.Unmarshal(trimmed, &answer); err != nil {
			return nil, fmt.Errorf("%s: JSON, but not a verification service's answer: %w", file, err)
		}
		if answer.Variant != v.String() {
			return nil, fmt.Errorf("%s: evidence of variant %s, --variant is %s", file, untrusted.Quote(answer.Variant), v)
		}
		evidence, err := base64.StdEncoding.DecodeString(answer.Evidence)
		if err != nil {
			return nil, fmt.Errorf("%s: evidence is not base64: %w", file, err)
		}
		return evidence, nil
	}
	return data, nil
}

// evidenceCollateral builds the collateral cache: fetching over HTTPS (recording for
// --save-collateral) unless --offline, preloaded with --collateral.
func evidenceCollateral(o evidenceOptions, now func() time.Time) (*collateral.Cache, *collateral.Recorder, error) {
	if o.offline && o.saveCollateral != "" {
		return nil, nil, errors.New("--save-collateral needs fetching: drop --offline")
	}
	cfg := collateral.Config{Now: now}
	var recorder *collateral.Recorder
	if !o.offline {
		cfg.Fetcher = collateral.NewHTTPFetcher(nil)
		if o.saveCollateral != "" {
			recorder = &collateral.Recorder{Fetcher: cfg.Fetcher}
			cfg.Fetcher = recorder
		}
	}
	cache := collateral.New(cfg)
	if o.collateral != "" {
		data, err := os.ReadFile(o.collateral)
		if err != nil {
			return nil, nil, fmt.Errorf("--collateral: %w", err)
		}
		entries, err := collateral.ParseBundle(data)
		if err != nil {
			return nil, nil, fmt.Errorf("--collateral %s: %w", o.collateral, err)
		}
		if err := cache.PutBundle(entries); err != nil {
			return nil, nil, fmt.Errorf("--collateral %s: %w", o.collateral, err)
		}
	}
	return cache, recorder, nil
}

// evidenceValidator builds the variant's validator from --reference.
func evidenceValidator(o evidenceOptions, v variant.Variant, cache *collateral.Cache, now func() time.Time, policy attestation.RevocationPolicy) (attestation.Validator, error) {
	if o.reference == "" {
		return nil, errors.New("--reference: required (the reference JSON to check the evidence against)")
	}
	data, err := os.ReadFile(o.reference)
	if err != nil {
		return nil, fmt.Errorf("--reference: %w", err)
	}
	ref, err := choose.DecodeReference(data)
	if err != nil {
		return nil, fmt.Errorf("--reference %s: %w", o.reference, err)
	}
	if ref.Variant != v {
		return nil, fmt.Errorf("--reference %s is for variant %s, --variant is %s", o.reference, ref.Variant, v)
	}
	validator, err := choose.NewValidator(ref, choose.Options{Collateral: cache, Now: now, Revocation: policy})
	if err != nil {
		return nil, fmt.Errorf("--reference %s: %w", o.reference, err)
	}
	return validator, nil
}

// evidenceBinding returns the report data the evidence must bind: --report-data as it is, or
// what a verification service binds for --nonce.
func evidenceBinding(o evidenceOptions) ([]byte, error) {
	switch {
	case (o.reportData == "") == (o.nonce == ""):
		return nil, errors.New("give exactly one of --report-data HEX (your own binding) and --nonce HEX (a verification service's answer)")
	case o.reportData != "":
		rd, err := hex.DecodeString(o.reportData)
		if err != nil {
			return nil, fmt.Errorf("--report-data: %w", err)
		}
		return rd, nil
	}
	nonce, err := hex.DecodeString(o.nonce)
	if err != nil {
		return nil, fmt.Errorf("--nonce: %w", err)
	}
	rd, err := attestation.ReportData(attestation.PurposeVerify, nonce)
	if err != nil {
		return nil, fmt.Errorf("--nonce: %w", err)
	}
	return rd, nil
}

func saveBundle(file string, entries []collateral.BundleEntry) error {
	data, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(file, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("--save-collateral: %w", err)
	}
	return nil
}

func printEvidenceClaims(out io.Writer, format string, c evidenceClaims) error {
	if format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(c)
	}
	signer := "AK not certified"
	if c.Signer.Certified {
		signer = "AK certified"
		if c.Signer.Name != "" {
			signer += " for " + c.Signer.Name
		}
	}
	fmt.Fprintf(out, "OK    %s evidence bound to %s, reference set %q, %s\n", c.Variant, c.ReportData, c.ReferenceSet, signer)
	if hw := c.Hardware; hw != nil {
		fmt.Fprintf(out, "      hardware: %s on %s, signed by %s, TCB %s, matched %q, revocation checked: %t\n", hw.Technology, hw.Product, hw.Signer, hw.TCB, hw.Reference, hw.RevocationChecked)
		for _, w := range hw.Warnings {
			fmt.Fprintf(out, "      warning: %s\n", w)
		}
	}
	for _, w := range c.Warnings {
		fmt.Fprintf(out, "      warning: %s\n", w)
	}
	for _, r := range c.Registers {
		fmt.Fprintf(out, "      %s: %s\n", r.Name, r.Value)
	}
	return nil
}
