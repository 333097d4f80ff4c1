package azure

import (
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// AKHandle is the persistent handle of the attestation key Azure's HCL provisions in the
// vTPM: the key its runtime data names (HCLAkPub), so the key an Azure issuer must quote with.
const AKHandle = tpmutil.Handle(0x81000003)

// LoadAK loads the HCL's attestation key (for vtpm.IssuerConfig.LoadAK). It fails if the
// platform provisioned none: go-tpm-tools' default AK would be another key, which no
// runtime data names.
func LoadAK(rw io.ReadWriter) (*client.Key, error) {
	return client.LoadCachedKey(rw, AKHandle, client.NullSession{})
}

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

// CheckOwnAK checks, on the issuer, that the HCL report's runtime data names the AK the
// issuer quotes with (akPublic, its TPMT_PUBLIC): otherwise every validator refuses the
// evidence, and only here is the cause plain (the issuer quotes with another key than the
// HCL's AK).
func CheckOwnAK(hcl *HCLReport, akPublic []byte) error {
	runtime, err := ParseRuntimeData(hcl.RuntimeData)
	if err != nil {
		return err
	}
	pub, err := tpm2.DecodePublic(akPublic)
	if err != nil {
		return fmt.Errorf("issuer's AK: %w", err)
	}
	key, err := pub.Key()
	if err != nil {
		return fmt.Errorf("issuer's AK: %w", err)
	}
	if err := runtime.CheckAK(key); err != nil {
		return fmt.Errorf("the issuer quotes with another key than the HCL report's AK: %w", err)
	}
	return nil
}
