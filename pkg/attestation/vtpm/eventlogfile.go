package vtpm

import (
	"fmt"
	"os"
)

// DefaultEventLogPath is where Linux exposes the firmware's TCG event log (securityfs).
const DefaultEventLogPath = "/sys/kernel/security/tpm0/binary_bios_measurements"

// ReadEventLog returns an IssuerConfig.EventLog that reads the event log at path on every
// evidence: the log grows while the system boots.
func ReadEventLog(path string) func() ([]byte, error) {
	return func() ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading the event log: %w", err)
		}
		return b, nil
	}
}
