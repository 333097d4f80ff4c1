package measuredboot

import (
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/google/go-eventlog/tcg"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/measuredboot/measuredboottest"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
)

// bootLog plays a node's firmware: it writes the event log of the given events (in order)
// and returns it with the PCR values a quote of that boot shows.
func bootLog(events []Event) ([]byte, map[uint32][]byte) {
	b := eventlog.NewBuilder()
	values := map[uint32][32]byte{}
	for _, e := range events {
		data := []byte(e.Description)
		if e.Type == tcg.Separator { // its data is bound to its digest: four zero bytes
			data = make([]byte, 4)
		}
		b.AddDigest(e.PCR, e.Type, e.Digest, data)
		values[e.PCR] = extend(values[e.PCR], e.Digest)
	}
	quoted := map[uint32][]byte{}
	for i := range uint32(eventlog.NumPCRs) {
		v := values[i]
		quoted[i] = v[:]
	}
	return b.Bytes(), quoted
}

// firmwareEvents are events of registers the prediction does not cover, as OVMF writes.
var firmwareEvents = []Event{
	{PCR: 0, Type: tcg.SCRTMVersion, Digest: sha256.Sum256([]byte("firmware")), Description: "firmware"},
	{PCR: 7, Type: tcg.Separator, Digest: sha256.Sum256(make([]byte, 4)), Description: "\x00\x00\x00\x00"},
}

func predictedEvents(p *Prediction) []Event {
	var out []Event
	for _, r := range p.Registers() {
		out = append(out, p.Events[r]...)
	}
	return out
}

// TestCheckEventLog plays attacks on the boot chain against a prediction: each must be
// refused with the register and the first differing event named.
func TestCheckEventLog(t *testing.T) {
	image := measuredboottest.UKI(testOsrel, []byte(testCmdline), testKernel, testInitrd)
	p, err := PredictUKI(image)
	require.NoError(t, err)

	other := func(osrel, cmdline, kernel, initrd []byte) []Event {
		q, err := PredictUKI(measuredboottest.UKI(osrel, cmdline, kernel, initrd))
		require.NoError(t, err)
		return predictedEvents(q)
	}
	genuine := append(append([]Event(nil), firmwareEvents...), predictedEvents(p)...)

	tests := map[string]struct {
		events []Event
		// tamper changes the log or the quote after the boot.
		tamper  func(log []byte, quoted map[uint32][]byte) []byte
		wantPCR []uint32
		wantMsg []string
	}{
		"genuine boot": {events: genuine},
		"other os-release in the UKI": {
			events:  append(append([]Event(nil), firmwareEvents...), other([]byte("ID=evil\n"), []byte(testCmdline), testKernel, testInitrd)...),
			wantPCR: []uint32{4, 11},
			wantMsg: []string{"event 2 of PCR 4 differs", "event 3 of PCR 11 differs: expected EV_IPL", "section .osrel data (24 bytes)", `observed EV_IPL`},
		},
		"changed kernel command line": {
			events:  append(append([]Event(nil), firmwareEvents...), other(testOsrel, []byte(testCmdline+" init=/bin/sh"), testKernel, testInitrd)...),
			wantPCR: []uint32{4, 9, 11},
			wantMsg: []string{"event 0 of PCR 9 differs", `init=/bin/sh`, "event 5 of PCR 11 differs"},
		},
		"another initrd": {
			events:  append(append([]Event(nil), firmwareEvents...), other(testOsrel, []byte(testCmdline), testKernel, []byte("evil initrd"))...),
			wantPCR: []uint32{4, 9, 11},
			wantMsg: []string{"event 1 of PCR 9 differs", "initrd (.initrd section, 1800 bytes)", `observed EV_EVENT_TAG`},
		},
		"DVD drive tried before the UKI": {
			events: func() []Event {
				ev := append([]Event(nil), firmwareEvents...)
				for _, e := range predictedEvents(p) {
					if e.PCR == 4 && e.Type == tcg.Separator {
						ev = append(ev,
							Event{PCR: 4, Type: tcg.EFIAction, Digest: sha256.Sum256([]byte("Returning from EFI Application from Boot Option")), Description: "Returning from EFI Application from Boot Option"},
							Event{PCR: 4, Type: tcg.EFIAction, Digest: sha256.Sum256([]byte("Calling EFI Application from Boot Option")), Description: "Calling EFI Application from Boot Option"})
					}
					ev = append(ev, e)
				}
				return ev
			}(),
			wantPCR: []uint32{4},
			wantMsg: []string{`event 1 of PCR 4 differs: expected EV_SEPARATOR`, `observed EV_EFI_ACTION`, `"Returning from EFI Application from Boot Option"`},
		},
		"credential measured into PCR 12": {
			events:  append(append([]Event(nil), genuine...), Event{PCR: 12, Type: tcg.Ipl, Digest: sha256.Sum256([]byte("cred")), Description: "credential"}),
			wantPCR: []uint32{12},
			wantMsg: []string{`event 0 of PCR 12 is unexpected: observed EV_IPL`, `"credential"`},
		},
		"node already carries a cluster ID": {
			events:  append(append([]Event(nil), genuine...), Event{PCR: 15, Type: tcg.Ipl, Digest: sha256.Sum256([]byte("cluster")), Description: "cluster ID"}),
			wantPCR: []uint32{15},
		},
		"kernel not loaded": {
			events: func() []Event {
				ev := append([]Event(nil), firmwareEvents...)
				for _, e := range predictedEvents(p) {
					if e.PCR == 4 && e.Description != "" && len(ev) > 0 && e.Type == tcg.EFIBootServicesApplication && e.Digest == p.Events[4][3].Digest {
						continue
					}
					ev = append(ev, e)
				}
				return ev
			}(),
			wantPCR: []uint32{4},
			wantMsg: []string{"event 3 of PCR 4 is missing: expected EV_EFI_BOOT_SERVICES_APPLICATION", "kernel (.linux section)"},
		},
		"quote does not cover PCR 13": {
			events: genuine,
			tamper: func(log []byte, quoted map[uint32][]byte) []byte {
				delete(quoted, 13)
				return log
			},
			wantPCR: []uint32{13},
			wantMsg: []string{"PCR 13 is not covered by the quote"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			log, quoted := bootLog(tc.events)
			if tc.tamper != nil {
				log = tc.tamper(log, quoted)
			}
			err := CheckEventLog(p, log, quoted)
			if tc.wantPCR == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			joined, ok := err.(interface{ Unwrap() []error })
			require.True(t, ok, "want register mismatches, got %v", err)
			var got []uint32
			for _, e := range joined.Unwrap() {
				var m *RegisterMismatch
				require.True(t, errors.As(e, &m), "error %v", e)
				got = append(got, m.PCR)
			}
			assert.Equal(t, tc.wantPCR, got)
			for _, msg := range tc.wantMsg {
				assert.ErrorContains(t, err, msg)
			}
		})
	}

	t.Run("log that does not replay to the quote", func(t *testing.T) {
		log, quoted := bootLog(genuine)
		quoted[11] = make([]byte, 32)
		err := CheckEventLog(p, log, quoted)
		assert.ErrorContains(t, err, "does not replay to the quoted value of PCR 11")
	})
	t.Run("garbage log", func(t *testing.T) {
		_, quoted := bootLog(genuine)
		assert.ErrorContains(t, CheckEventLog(p, []byte("garbage"), quoted), "event log")
	})
}
