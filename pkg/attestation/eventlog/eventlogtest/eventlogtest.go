// Package eventlogtest boots test TPMs the way firmware does: every measurement is extended
// into the TPM and recorded in a genuine TCG event log, so validators can replay the log
// against the quoted PCRs.
package eventlogtest

import (
	"testing"

	"github.com/google/go-eventlog/tcg"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
)

// Extender extends a PCR (vtpm.TPM).
type Extender interface {
	ExtendPCR(idx int, digest []byte) error
}

// Measurement is one event of a boot.
type Measurement struct {
	PCR  uint32
	Type tcg.EventType
	Data []byte
}

// Image is a boot of a node image: firmware version, the boot loader, kernel, command line
// and a separator in each firmware PCR, the way UEFI firmware logs.
func Image(component string) []Measurement {
	return []Measurement{
		{0, tcg.SCRTMVersion, []byte("test firmware 1.0\x00")},
		{0, tcg.Separator, []byte{0, 0, 0, 0}},
		{4, tcg.EFIAction, []byte(tcg.CallingEFIApplication)},
		{4, tcg.Ipl, []byte("bootloader " + component)},
		{4, tcg.Separator, []byte{0, 0, 0, 0}},
		{7, tcg.Separator, []byte{0, 0, 0, 0}},
		{8, tcg.Ipl, []byte("kernel_cmdline: console=ttyS0 " + component)},
		{9, tcg.Ipl, []byte("initrd " + component)},
	}
}

// Boot extends every measurement into tpm, in order, and returns the event log that records
// them.
func Boot(t testing.TB, tpm Extender, ms []Measurement) []byte {
	t.Helper()
	log, err := BootLog(tpm, ms)
	require.NoError(t, err)
	return log
}

// BootLog is Boot for code without a testing.TB (examples, other modules' tests).
func BootLog(tpm Extender, ms []Measurement) ([]byte, error) {
	b := eventlog.NewBuilder()
	for _, m := range ms {
		d := b.Add(m.PCR, m.Type, m.Data)
		if err := tpm.ExtendPCR(int(m.PCR), d[:]); err != nil {
			return nil, err
		}
	}
	return b.Bytes(), nil
}
