package azuremeta

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// ConsoleReport is a node's phase report on its VM's serial console: Azure keeps the serial
// log (boot diagnostics), and the host half reads a node's last report from it, the way the
// local provider's nodes report to its metadata service. The node writes one line per
// report; the boot it names tells the CLI whether the report is of the VM's current boot.
type ConsoleReport struct {
	Phase  string
	Detail string
	// Boot is when the node's machine booted (its kernel's boot time).
	Boot time.Time
}

// Line is the report as the node writes it:
//
//	constellation: phase rejoined boot 2026-11-30T08:30:05.5Z: "detail"
func (r ConsoleReport) Line() string {
	if len(r.Detail) > MaxDetailBytes {
		r.Detail = strings.ToValidUTF8(r.Detail[:MaxDetailBytes], "")
	}
	return fmt.Sprintf("constellation: phase %s boot %s: %s\n", r.Phase, r.Boot.UTC().Format(time.RFC3339Nano), strconv.Quote(r.Detail))
}

// consoleLine is a report line; a serial log may put anything before it (a carriage return,
// a timestamp) on the line. Lines longer than maxConsoleLine are no report.
var consoleLine = regexp.MustCompile(`constellation: phase ([a-z][a-z-]{0,63}) boot ([0-9T:.Z+-]{1,40}): ("(?:[^"\\\n]|\\.)*")\r?$`)

// maxConsoleLine bounds a report line: a phase, a time and a detail of MaxDetailBytes, each
// byte of which Go's quoting may turn into four.
const maxConsoleLine = 4 << 10

// MaxDetailBytes is how much of a detail a line carries.
const MaxDetailBytes = 512

// LastConsoleReport returns the last well-formed report in log, a VM's serial log (or its
// end), and whether there is one. The log is the VM's output, untrusted: a line that does not
// parse is skipped, and the detail comes back escaped, one bounded line.
func LastConsoleReport(log []byte) (ConsoleReport, bool) {
	lines := bytes.Split(log, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		if len(lines[i]) > maxConsoleLine {
			continue
		}
		m := consoleLine.FindSubmatch(lines[i])
		if m == nil || !metadata.ValidPhase(string(m[1])) {
			continue
		}
		boot, err := time.Parse(time.RFC3339Nano, string(m[2]))
		if err != nil {
			continue
		}
		detail, err := strconv.Unquote(string(m[3]))
		if err != nil {
			continue
		}
		return ConsoleReport{Phase: string(m[1]), Detail: untrusted.Text(detail), Boot: boot}, true
	}
	return ConsoleReport{}, false
}
