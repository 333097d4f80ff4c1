package azure

import (
	"fmt"

	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// ReadHCLReport reads the HCL report from the vTPM's NV index HCLReportNVIndex, checks that it
// parses and holds a hardware report of type want, and returns it as read (the validator
// parses it again: the issuer's parse only makes a broken platform fail here, with a clear
// message, rather than at every verifier).
func ReadHCLReport(tpm *vtpm.TPM, want ReportType) ([]byte, *HCLReport, error) {
	raw, err := tpm.ReadNV(HCLReportNVIndex)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the HCL report: %w", err)
	}
	r, err := ParseHCLReport(raw)
	if err != nil {
		return nil, nil, err
	}
	if r.Type != want {
		return nil, nil, fmt.Errorf("the HCL report holds a %s report, want %s", r.Type, want)
	}
	return raw, r, nil
}
