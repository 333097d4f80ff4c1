package joinservice

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"

	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// ServiceCheck is how a joining node verifies the join service before it takes anything from
// it (docs/joinservice.md, "How a node checks the join service"): upstream's join client
// verified nothing and would hand its CSR to, and take keys from, anyone.
//
// The service must
//   - sign with an AK the platform's CA certified, the CA read from the node's own TPM
//     (vtpm.AKRootsNVIndex, a platform index the node's software cannot write);
//   - be certified as a control-plane node (a worker, or any node the platform did not make a
//     control plane, never serves keys to a joining node);
//   - run this node's image (the node's own PCRs 0..14) or one of ReferenceSets;
//   - be initialized: PCR 15 non-zero, and equal to the marker of the ticket's cluster
//     (CheckClusterID, which the join client runs before it commits anything).
//
// The node builds it only through Validator, from its TPM: there is no way to hand it roots
// or own measurements that did not come from the node's TPM.
type ServiceCheck struct {
	// Variant is the node's attestation variant, which its platform names: the service runs
	// on a node of the same platform. Required.
	Variant variant.Variant
	// ReferenceSets are accepted besides the node's own image, for example the previous
	// image during an upgrade. Most nodes have none.
	ReferenceSets measurements.ReferenceSets
	Log           *slog.Logger
}

// NodeTPM is what the check reads from the joining node's own TPM (vtpm.TPM, vtpm.PerUseTPM).
type NodeTPM interface {
	ReadPCRs(pcrs ...int) (map[uint32][]byte, error)
	ReadPlatformNV(index uint32) ([]byte, error)
}

// ownImageSet names the reference set made of the node's own measurements.
const ownImageSet = "this node's image"

// Validator reads the node's AK root and image measurements from tpm and returns the
// validator the join client uses for the service's evidence. It fails, and the node joins
// nothing, when the platform provisioned no trustworthy AK root.
func (c ServiceCheck) Validator(tpm NodeTPM) (attestation.Validator, error) {
	roots, err := akRoots(tpm)
	if err != nil {
		return nil, err
	}
	// The registers the image measures, by the variant's register map (the rule every
	// reference set follows).
	image := c.Variant.ImageRegisters()
	if len(image) == 0 {
		return nil, fmt.Errorf("service check: variant %q has no register map", c.Variant)
	}
	idx := make([]int, len(image))
	for i, r := range image {
		idx[i] = int(r)
	}
	own, err := tpm.ReadPCRs(idx...)
	if err != nil {
		return nil, fmt.Errorf("service check: reading this node's measurements: %w", err)
	}
	m := measurements.M{}
	for _, r := range image {
		val, ok := own[r]
		if !ok {
			return nil, fmt.Errorf("service check: this node's TPM did not return PCR %d", r)
		}
		m[r] = measurements.Measurement{Expected: val}
	}
	sets := append(measurements.ReferenceSets{{Name: ownImageSet, Measurements: m}}, c.ReferenceSets...)
	val, err := choose.NewValidator(choose.Reference{Variant: c.Variant, Values: choose.Values{Measurements: sets, AKRoots: roots}}, choose.Options{Log: c.Log})
	if err != nil {
		return nil, fmt.Errorf("service check: %w", err)
	}
	return serviceValidator{val}, nil
}

// akRoots reads the platform's AK CA certificate from the node's TPM and returns it as PEM.
func akRoots(tpm NodeTPM) (string, error) {
	der, err := tpm.ReadPlatformNV(vtpm.AKRootsNVIndex)
	if err != nil {
		return "", fmt.Errorf("service check: no trustworthy AK root from the platform, so no join service can be trusted: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", fmt.Errorf("service check: the platform's AK root: %w", err)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return "", fmt.Errorf("service check: the platform's AK root %q is not a CA certificate", cert.Subject.CommonName)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
}

// serviceValidator adds what a join service must be beyond authentic evidence of an
// accepted image: a certified control plane, initialized.
type serviceValidator struct{ attestation.Validator }

func (v serviceValidator) Validate(ctx context.Context, evidence []byte, purpose attestation.Purpose, data []byte) (*attestation.Verified, error) {
	verified, err := v.Validator.Validate(ctx, evidence, purpose, data)
	if err != nil {
		return nil, err
	}
	if !verified.SignerCertified {
		return nil, fmt.Errorf("%w: the join service's AK is not certified by the platform", attestation.ErrUntrustedSigner)
	}
	if verified.SignerRole != metadata.ControlPlane {
		return nil, fmt.Errorf("%w: the join service's node %q is certified as %q, not as a %s", attestation.ErrUntrustedSigner,
			verified.SignerName, verified.SignerRole, metadata.ControlPlane)
	}
	// The variant says which register carries the marker.
	reg, ok := verified.Variant.ClusterIDRegister()
	if !ok {
		return nil, fmt.Errorf("%w: the join service's evidence names no variant", attestation.ErrMalformed)
	}
	marker := verified.Registers[reg]
	if len(marker) == 0 || bytes.Equal(marker, make([]byte, len(marker))) {
		return nil, fmt.Errorf("%w: the join service's node is not initialized (%s is zero)", attestation.ErrMeasurementPolicy, verified.Variant.RegisterName(reg))
	}
	return verified, nil
}

// CheckClusterID checks, once the ticket has arrived and before the node commits to it, that
// the service's node is initialized for the cluster the ticket is for: its marker register
// equals the value the measurement secret and salt of the ticket imply. A service of another
// cluster, or one relaying another cluster's tickets, fails here.
func CheckClusterID(service *attestation.Verified, measurementSecret, measurementSalt []byte) error {
	if service == nil {
		return errors.New("no verified join service evidence")
	}
	id, err := kms.ClusterID(measurementSecret, measurementSalt)
	if err != nil {
		return err
	}
	return CheckCluster(service, id)
}

// CheckCluster checks that the service's node is initialized for the cluster of the given ID
// (its marker register). A node that knows its cluster already (it joined) checks a service
// with it before it takes anything from it, a volume key for one: a service of another
// cluster of the same image would otherwise hand it a key it knows.
func CheckCluster(service *attestation.Verified, id []byte) error {
	if service == nil {
		return errors.New("no verified join service evidence")
	}
	if len(id) == 0 {
		return errors.New("no cluster ID to check the join service against")
	}
	reg, ok := service.Variant.ClusterIDRegister()
	if !ok {
		return fmt.Errorf("%w: the join service's evidence names no variant", attestation.ErrMalformed)
	}
	if want := service.Variant.ClusterIDMarker(id); !bytes.Equal(service.Registers[reg], want) {
		return fmt.Errorf("%w: join service belongs to another cluster: %s is %x, this cluster's marker is %x",
			attestation.ErrMeasurementPolicy, service.Variant.RegisterName(reg), service.Registers[reg], want)
	}
	return nil
}
