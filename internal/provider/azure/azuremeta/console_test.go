package azuremeta

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConsoleReport(t *testing.T) {
	boot := time.Date(2026, 11, 30, 8, 30, 5, 500000000, time.UTC)
	joined := ConsoleReport{Phase: "joined", Boot: boot}
	refused := ConsoleReport{Phase: "state-disk-refused", Detail: "header differs: \"x\"\x1b[31m\nsecond line", Boot: boot.Add(time.Minute)}
	assert.Equal(t, "constellation: phase joined boot 2026-11-30T08:30:05.5Z: \"\"\n", joined.Line())

	testCases := map[string]struct {
		log    string
		want   ConsoleReport
		wantOK bool
	}{
		"the last report wins": {
			log: "[    0.000000] Linux version 6.12\n" + joined.Line() + "kernel noise\n" + refused.Line() + "more noise\n", wantOK: true,
			want: ConsoleReport{Phase: "state-disk-refused", Detail: `header differs: "x"\x1b[31m\nsecond line`, Boot: boot.Add(time.Minute)},
		},
		"a prefix and a carriage return": {
			log: "\x1b[0m[  OK  ] " + strings.TrimSuffix(joined.Line(), "\n") + "\r\n", want: joined, wantOK: true,
		},
		"a cut line before a whole one": {
			log: joined.Line() + `constellation: phase rejoined boot 2026-11-30T08:40:00Z: "cut`, want: joined, wantOK: true,
		},
		"no report":           {log: "[    0.000000] Linux version 6.12\n"},
		"a phase of capitals": {log: `constellation: phase JOINED boot 2026-11-30T08:30:05Z: ""` + "\n"},
		"a bad boot time":     {log: `constellation: phase joined boot 2026-13-30T08:30:05Z: ""` + "\n"},
		"an unquoted detail":  {log: `constellation: phase joined boot 2026-11-30T08:30:05Z: hello` + "\n"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, ok := LastConsoleReport([]byte(tc.log))
			require.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.want.Phase, got.Phase)
			assert.Equal(t, tc.want.Detail, got.Detail)
			assert.True(t, tc.want.Boot.Equal(got.Boot), "boot %s", got.Boot)
		})
	}
}

func FuzzLastConsoleReport(f *testing.F) {
	f.Add([]byte(ConsoleReport{Phase: "joined", Detail: "a\nb", Boot: time.Unix(1, 0)}.Line()))
	f.Add([]byte("noise\r\nconstellation: phase waiting-for-recovery boot 2026-11-30T08:30:05+01:00: \"\\x00\"\r\n"))
	f.Add([]byte(`constellation: phase a boot 0: "`))
	f.Fuzz(func(t *testing.T, log []byte) {
		r, ok := LastConsoleReport(log)
		if !ok {
			return
		}
		// What parsed is printable: a valid phase, a detail of one bounded line.
		if strings.ContainsAny(r.Detail, "\n\r\x1b") || len(r.Detail) > 600 || r.Phase == "" {
			t.Fatalf("parsed %+v from %q", r, log)
		}
	})
}

func TestConsoleReportLineIsBounded(t *testing.T) {
	line := ConsoleReport{Phase: "joined", Detail: strings.Repeat("\x00é", 2000), Boot: time.Unix(0, 0)}.Line()
	r, ok := LastConsoleReport([]byte(line))
	require.True(t, ok, "a long detail is cut, not dropped")
	assert.Equal(t, "joined", r.Phase)
}
