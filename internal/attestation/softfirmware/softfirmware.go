// Package softfirmware is a firmware in software: it measures a node image's components into
// a TPM with a TCG event log, computes the same values offline as reference values, certifies
// the TPM's attestation keys and provisions their root, then locks the platform hierarchy.
// The local provider plays firmware with it for its sandbox nodes (internal/provider/local),
// and the bootstrapper's test harness for its node (internal/bootstrapper/bootstraptest).
// Machines have a real firmware that measures instead (docs/measured-boot.md); the QEMU
// provider still certifies their AKs with CertifyAK before each boot, as a platform vendor
// provisions a TPM.
package softfirmware

import (
	"crypto/sha256"
	"fmt"
	"os"
	"time"

	"github.com/google/go-eventlog/tcg"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the attestation variant of a TPM this firmware measured: a quote of the TPM,
// its AK certified by CertifyAK's CA.
var Variant = variant.QEMUVTPM

// Component is one measured part of a node image.
type Component struct {
	Name   string
	PCR    int
	Digest [32]byte
}

// FileComponent measures a file.
func FileComponent(name string, pcr int, path string) (Component, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Component{}, fmt.Errorf("measuring %s: %w", name, err)
	}
	return Component{Name: name, PCR: pcr, Digest: sha256.Sum256(data)}, nil
}

// BytesComponent measures in-memory content, such as a rendered configuration.
func BytesComponent(name string, pcr int, data []byte) Component {
	return Component{Name: name, PCR: pcr, Digest: sha256.Sum256(data)}
}

// Measure extends each component into the node's TPM, in order, as firmware would at boot.
// It keeps no event log; MeasureLogged is the measured boot of a node.
func Measure(tpm *vtpm.TPM, image []Component) error {
	_, err := MeasureLogged(tpm, image)
	return err
}

// MeasureLogged extends each component into the node's TPM, in order, and returns the TCG
// event log of these extensions (crypto-agile, SHA-256): one EV_IPL event per component,
// carrying its name, recorded before the extension as firmware records it. A TPM startup
// resets the PCRs, so the log of one boot is the whole log: the provider rewrites it at
// every boot. Verifiers replay it against the quoted PCRs; it is no more trusted than that.
func MeasureLogged(tpm *vtpm.TPM, image []Component) ([]byte, error) {
	log, err := ImageEventLog(image)
	if err != nil {
		return nil, err
	}
	for _, c := range image {
		if err := tpm.ExtendPCR(c.PCR, c.Digest[:]); err != nil {
			return nil, fmt.Errorf("measuring %s: %w", c.Name, err)
		}
	}
	return log, nil
}

// ImageEventLog computes offline the event log MeasureLogged writes for image, as
// ExpectedPCRs computes the PCRs: what a node booting image sends with its evidence.
func ImageEventLog(image []Component) ([]byte, error) {
	log := eventlog.NewBuilder()
	for _, c := range image {
		if c.PCR < 0 || c.PCR >= eventlog.NumPCRs {
			return nil, fmt.Errorf("measuring %s: PCR %d out of range", c.Name, c.PCR)
		}
		log.AddDigest(uint32(c.PCR), tcg.Ipl, c.Digest, []byte(c.Name))
	}
	return log.Bytes(), nil
}

// ExpectedPCRs computes offline the PCR values a node booting image shows, and returns them
// as an enforced reference set over PCRs 0..14: exactly what Measure produces on a fresh TPM.
func ExpectedPCRs(image []Component) measurements.M {
	pcrs := map[int][32]byte{}
	for _, c := range image {
		prev := pcrs[c.PCR]
		pcrs[c.PCR] = sha256.Sum256(append(prev[:], c.Digest[:]...))
	}
	m := measurements.M{}
	clusterID, _ := Variant.ClusterIDRegister()
	for i := 0; i < int(clusterID); i++ {
		v := pcrs[i]
		m[uint32(i)] = measurements.Measurement{Expected: v[:]}
	}
	return m
}

// CertifyAK certifies both AKs (RSA and ECC) of the node's TPM with the provider's CA, for
// the node's name and role, and stores the certificates in the TPM's NV, where the node's
// issuers find them. Both are certified because which one a node quotes with is the node's
// choice (vtpm.AKAlgorithm): the bootstrapper uses RSA, the join service ECC.
//
// It also provisions the CA's certificate as the node's AK root (vtpm.AKRootsNVIndex), in a
// platform index the node's software cannot rewrite once LockPlatform ran: the root the node
// checks the join service's AK against. A cloud bakes its AK roots into the measured image
// instead (docs/local-provider.md, "TPM NV indices").
func CertifyAK(tpm *vtpm.TPM, ca *akca.CA, nodeName string, role metadata.Role, now time.Time) error {
	for _, alg := range vtpm.AKAlgorithms {
		// The variant only labels evidence; the AK is the same.
		iss, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: Variant, AK: alg})
		if err != nil {
			return fmt.Errorf("loading %s AK of %s: %w", alg, nodeName, err)
		}
		cert, err := ca.CertifyAK(iss.AKPublic(), nodeName, role, now, 365*24*time.Hour)
		iss.Close()
		if err != nil {
			return fmt.Errorf("certifying %s AK of %s: %w", alg, nodeName, err)
		}
		if err := tpm.WriteNV(alg.CertNVIndex(), cert); err != nil {
			return fmt.Errorf("storing %s AK certificate of %s: %w", alg, nodeName, err)
		}
	}
	if err := tpm.WritePlatformNV(vtpm.AKRootsNVIndex, ca.Certificate().Raw); err != nil {
		return fmt.Errorf("provisioning the AK root of %s: %w", nodeName, err)
	}
	return nil
}

// LockPlatform ends the provider's firmware role for this boot of the node: it disables the
// TPM's platform hierarchy, so nothing the node runs can rewrite the AK root (or any other
// platform index). Call it at every boot (a TPM startup enables the hierarchy again), after
// Measure and CertifyAK, before the node's software starts.
func LockPlatform(tpm *vtpm.TPM) error {
	return tpm.DisablePlatformHierarchy()
}
