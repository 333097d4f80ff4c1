package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// looseSets are reference sets that admit more than the image: what an operator might write
// by mistake, or an attacker who can edit the configuration would write to admit its own
// nodes. Each value is the YAML of the set's measurements and the registers the error must
// name.
var looseSets = map[string]struct {
	measurements string
	want         []string
}{
	"only PCR 0 enforced": {
		measurements: fmt.Sprintf("{\"0\": %q}", hexOf(0)),
		want:         []string{"missing PCR 1, PCR 2, PCR 3, PCR 4, PCR 5, PCR 6, PCR 7, PCR 8, PCR 9, PCR 10, PCR 11, PCR 12, PCR 13, PCR 14"},
	},
	"only software-resettable PCRs 16 and 23": {
		measurements: fmt.Sprintf("{\"16\": %q, \"23\": %q}", hexOf(0), hexOf(0)),
		want:         []string{"missing PCR 0, PCR 1", "PCR 16, PCR 23 not measured by the image"},
	},
	"full set plus PCR 16": {
		measurements: strings.Replace(fullSetYAML(nil), "}", fmt.Sprintf(", \"16\": %q}", hexOf(0)), 1),
		want:         []string{"PCR 16 not measured by the image"},
	},
	"bootstrapper PCR 11 warn-only": {
		measurements: strings.Replace(fullSetYAML(nil), fmt.Sprintf("\"11\": %q", hexOf(0)), fmt.Sprintf("\"11\": {expected: %q, warnOnly: true}", hexOf(0xab)), 1),
		want:         []string{"PCR 11 warn-only"},
	},
	"PCR 15 pinned to a cluster": {
		measurements: strings.Replace(fullSetYAML(nil), "}", fmt.Sprintf(", \"15\": %q}", hexOf(7)), 1),
		want:         []string{"PCR 15 must not be in a reference set"},
	},
	"PCR 15 pinned to zero (uninitialized)": {
		measurements: strings.Replace(fullSetYAML(nil), "}", fmt.Sprintf(", \"15\": %q}", hexOf(0)), 1),
		want:         []string{"PCR 15 must not be in a reference set"},
	},
}

// loosePolicyYAML is the valid configuration with a second set, named name, of the given
// measurements: the good set next to it must not make the loose one acceptable.
func loosePolicyYAML(name, measurements string) string {
	set := fmt.Sprintf("    - name: %s\n      measurements: %s\n", name, measurements)
	i := strings.Index(validYAML, "network:\n")
	return validYAML[:i] + set + validYAML[i:]
}

// TestLoadRefusesLooseReferenceSets: config.Load, what every CLI command reads the
// configuration with, refuses each loose set with an error naming the file, the set and the
// registers.
func TestLoadRefusesLooseReferenceSets(t *testing.T) {
	for name, tc := range looseSets {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			require.NoError(t, os.WriteFile(path, []byte(loosePolicyYAML("loose", tc.measurements)), 0o644))
			_, err := Load(path)
			require.Error(t, err)
			assert.ErrorContains(t, err, path)
			for _, want := range tc.want {
				assert.ErrorContains(t, err, `attestation.qemuVTPM.measurements[1].measurements: set "loose": `+want)
			}
			assert.NotContains(t, err.Error(), "measurements[0]", "the good set is not blamed")
		})
	}
	// The good set alone loads: the refusals are about the loose set.
	path := filepath.Join(t.TempDir(), FileName)
	require.NoError(t, os.WriteFile(path, []byte(validYAML), 0o644))
	_, err := Load(path)
	require.NoError(t, err)
}
