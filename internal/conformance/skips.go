package conformance

import (
	"regexp"
	"strings"
)

// Skip is a conformance test this repository does not run, by name, and why.
type Skip struct {
	// Name is a regular expression matched against the test's full name.
	Name string
	// Reason is why it cannot pass here (docs/conformance.md lists them).
	Reason string
}

// Skips are the tests skipped by name. Only tests that need what a local cluster without a
// network to the outside cannot have belong here; a test that fails because of the cluster is
// a defect to fix, not to skip.
var Skips = []Skip{}

// SkipRegex is the suite's --ginkgo.skip expression for Skips ("" when there are none).
func SkipRegex() string {
	parts := make([]string, 0, len(Skips))
	for _, s := range Skips {
		parts = append(parts, "(?:"+s.Name+")")
	}
	return strings.Join(parts, "|")
}

// compiledSkips are Skips' expressions, compiled (a bad one panics in the tests, not at run).
func compiledSkips() []*regexp.Regexp {
	out := make([]*regexp.Regexp, len(Skips))
	for i, s := range Skips {
		out[i] = regexp.MustCompile(s.Name)
	}
	return out
}
