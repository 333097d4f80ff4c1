package measuredboot

import (
	"testing"

	"github.com/openconstellation/constellation/internal/measuredboot/measuredboottest"
)

// FuzzPredict feeds arbitrary bytes as a UKI: parsing, the Authenticode digest and the
// prediction must never panic, and a UKI that parses has the sections PCR 9 needs.
func FuzzPredict(f *testing.F) {
	f.Add(measuredboottest.UKI(testOsrel, []byte(testCmdline), testKernel, testInitrd))
	f.Add(testKernel)
	f.Add([]byte("MZ"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _ = AuthenticodeSHA256(raw)
		u, err := ParseUKI(raw)
		if err != nil {
			return
		}
		if u.Sections[".linux"] == nil || u.Sections[".initrd"] == nil {
			t.Fatal("parsed UKI without .linux or .initrd")
		}
		_, _ = PredictUKI(raw)
	})
}

// FuzzCheckEventLog feeds arbitrary bytes as a node's event log: the check must never
// panic, and must refuse any log that does not replay to the prediction.
func FuzzCheckEventLog(f *testing.F) {
	p, err := PredictUKI(measuredboottest.UKI(testOsrel, []byte(testCmdline), testKernel, testInitrd))
	if err != nil {
		f.Fatal(err)
	}
	genuine, quoted := bootLog(append(append([]Event(nil), firmwareEvents...), predictedEvents(p)...))
	f.Add(genuine)
	f.Add(genuine[:len(genuine)/2])
	f.Fuzz(func(t *testing.T, raw []byte) {
		err := CheckEventLog(p, raw, quoted)
		if err != nil {
			_ = err.Error()
		}
	})
}
