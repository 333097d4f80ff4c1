package joinservice

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/openconstellation/constellation/internal/attestation"
	"github.com/openconstellation/constellation/internal/attestation/measurements"
	"github.com/openconstellation/constellation/internal/attestation/qemu"
	"github.com/openconstellation/constellation/internal/attestation/variant"
	"github.com/openconstellation/constellation/internal/kms"
)

// ClusterIDRegister is the register that carries the initialized marker (DESIGN 2: PCR 15).
const ClusterIDRegister = kms.InitializedPCR

// ServiceCheck is how a joining node verifies the join service (DESIGN 3.2): upstream's join
// client verified nothing and would hand its CSR to, and take keys from, anyone.
type ServiceCheck struct {
	// Own holds the node's own register values (read from its TPM); Registers lists the ones
	// that describe the image (for the local provider PCRs 0-14). The service must show the
	// same values: it runs on a node of the same image.
	Own       map[uint32][]byte
	Registers []uint32
	// ReferenceSets, when set, replace the own-measurement set (e.g. during an upgrade, when
	// the service may run the previous image).
	ReferenceSets measurements.ReferenceSets
	// AKRoots: the platform's AK CA (see qemu.ValidatorConfig).
	AKRoots *x509.CertPool
}

// Validator returns the validator the join client uses for the service's evidence. Beyond the
// reference values it requires an initialized service node (ClusterIDRegister not zero); after
// the ticket, CheckClusterID pins that register to this cluster.
func (c ServiceCheck) Validator(v variant.Variant) (attestation.Validator, error) {
	if v.String() != qemu.Variant.String() {
		return nil, fmt.Errorf("service check for variant %s is not implemented", v)
	}
	sets := c.ReferenceSets
	if len(sets) == 0 {
		m := measurements.M{}
		for _, r := range c.Registers {
			val, ok := c.Own[r]
			if !ok {
				return nil, fmt.Errorf("own measurements lack register %d", r)
			}
			m[r] = measurements.Measurement{Expected: val}
		}
		sets = measurements.ReferenceSets{{Name: "own-boot-measurements", Measurements: m}}
	}
	val, err := qemu.NewValidator(qemu.ValidatorConfig{ReferenceSets: sets, AKRoots: c.AKRoots})
	if err != nil {
		return nil, err
	}
	return initializedValidator{val}, nil
}

type initializedValidator struct{ attestation.Validator }

func (v initializedValidator) Validate(ctx context.Context, evidence []byte, purpose attestation.Purpose, data []byte) (*attestation.Verified, error) {
	verified, err := v.Validator.Validate(ctx, evidence, purpose, data)
	if err != nil {
		return nil, err
	}
	marker := verified.Registers[ClusterIDRegister]
	if len(marker) == 0 || bytes.Equal(marker, make([]byte, len(marker))) {
		return nil, fmt.Errorf("%w: the join service's node is not initialized (PCR %d is zero)", attestation.ErrMeasurementPolicy, ClusterIDRegister)
	}
	return verified, nil
}

// CheckClusterID checks, once the ticket has arrived, that the service's node is initialized
// for the cluster the ticket is for: its marker register equals the value the measurement
// secret and salt of the ticket imply. A service of another cluster fails here.
func CheckClusterID(service *attestation.Verified, measurementSecret, measurementSalt []byte) error {
	if service == nil {
		return errors.New("no verified join service evidence")
	}
	id, err := kms.ClusterID(measurementSecret, measurementSalt)
	if err != nil {
		return err
	}
	if want := kms.InitializedPCR15(id); !bytes.Equal(service.Registers[ClusterIDRegister], want) {
		return fmt.Errorf("%w: join service belongs to another cluster: PCR %d is %x, this cluster's marker is %x",
			attestation.ErrMeasurementPolicy, ClusterIDRegister, service.Registers[ClusterIDRegister], want)
	}
	return nil
}
