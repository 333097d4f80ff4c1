package choose_test

import (
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/google/go-tpm-tools/simulator"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// A relying party with a binding scheme of its own (here: a hash of its session key) checks
// evidence it was handed: NewValidator from the reference it trusts, then ValidateReportData
// with the report data it expects. CollateralURLs lists what the check reads from AMD or
// Intel (nothing, for a TPM-only variant).
func ExampleNewValidator() {
	evidence, image, sessionKeyHash, err := tpmEvidence()
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()

	ref := choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{
		Measurements:   measurements.ReferenceSets{{Name: "image-v1", Measurements: image}},
		HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: true}, // a real party pins AK roots instead
	}}
	validator, err := choose.NewValidator(ref, choose.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	urls, err := attestation.CollateralURLs(validator, evidence)
	if err != nil {
		fmt.Println(err)
		return
	}
	verified, err := attestation.ValidateReportData(ctx, validator, evidence, sessionKeyHash)
	if err != nil {
		fmt.Println("refused:", err)
		return
	}
	fmt.Println("collateral to fetch:", len(urls))
	fmt.Println("reference set:", verified.ReferenceSet)

	other := sha256.Sum256([]byte("someone else's session key"))
	_, err = attestation.ValidateReportData(ctx, validator, evidence, other[:])
	fmt.Println("bound to another key:", attestation.Reason(err))
	// Output:
	// collateral to fetch: 0
	// reference set: image-v1
	// bound to another key: nonce-mismatch
}

// tpmEvidence boots a simulated TPM (PCRs 0..14 measured and logged) and returns evidence
// whose quote binds the SHA-256 of a session key, the image's reference values and that hash.
func tpmEvidence() (evidence []byte, image measurements.M, reportData []byte, err error) {
	sim, err := simulator.Get()
	if err != nil {
		return nil, nil, nil, err
	}
	tpm := vtpm.New(sim, "simulator")
	defer tpm.Close()
	image, log, err := vtpmtest.BootImage(tpm, variant.QEMUVTPM, "v1")
	if err != nil {
		return nil, nil, nil, err
	}
	issuer, err := qemu.NewIssuer(tpm, nil, func() ([]byte, error) { return log, nil })
	if err != nil {
		return nil, nil, nil, err
	}
	defer issuer.Close()
	// The party's own binding. A Constellation issuer binds ReportData(purpose, data), so
	// the node is asked with the data whose binding is the hash: the party's scheme then
	// checks the binding as it is.
	sessionKey := sha256.Sum256([]byte("relying party session key"))
	reportData, err = attestation.ReportData(attestation.PurposeVerify, sessionKey[:])
	if err != nil {
		return nil, nil, nil, err
	}
	evidence, err = issuer.Issue(context.Background(), attestation.PurposeVerify, sessionKey[:])
	return evidence, image, reportData, err
}
