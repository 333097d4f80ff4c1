// Package local is the local sandbox provider's shared facts: the attestation variant of its
// nodes, the PCR map and files of its node image, and the event log file its firmware
// (internal/attestation/softfirmware) writes for a node.
package local

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
)

// Variant is the attestation variant the local provider's nodes attest with: a quote of their
// swtpm, whose AK the provider certifies. The CLI, the join service and the nodes learn it
// from here (or from the cluster record), never by naming it themselves.
var Variant = softfirmware.Variant

// PCR map of a local node image (docs/attestation.md). PCRs 0-10 stay zero: there is no
// firmware or kernel in a sandbox. PCR 15 is reserved for the cluster-ID marker, set at
// init/join, and is not part of the image's reference values.
const (
	PCRBootstrapper = 11 // SHA-256 of the bootstrapper binary
	PCRNodeConfig   = 12 // SHA-256 of the node image configuration
	PCRClusterID    = 15
)

// EventLogFile is the name of the event log in a node's TPM folder, next to the swtpm's
// state and socket: written by the provider at every boot, read by the node (nodeos binds
// it read-only into the node's /run).
const EventLogFile = "eventlog"

// WriteEventLog replaces the event log file at path with log, atomically: a node that reads
// it while the provider writes sees the old or the new log, never half of one.
func WriteEventLog(path string, log []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing the event log: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(log); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the event log: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the event log: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the event log: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing the event log: %w", err)
	}
	return nil
}
