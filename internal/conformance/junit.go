package conformance

import (
	"encoding/xml"
	"fmt"
	"io"
	"sort"
	"strings"
)

// junitSuites is the part of a JUnit report (as ginkgo writes it) a summary needs.
type junitSuites struct {
	Suites []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Cases []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string        `xml:"name,attr"`
	Status  string        `xml:"status,attr"`
	Time    float64       `xml:"time,attr"`
	Failure *junitMessage `xml:"failure"`
	Error   *junitMessage `xml:"error"`
	Skipped *junitMessage `xml:"skipped"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// Failure is a failed (or skipped) test and the first line of its failure (or of the reason
// the test gave for skipping itself).
type Failure struct {
	Name, Reason string
}

// Summary counts a run's tests ("[It]" nodes of the JUnit report).
type Summary struct {
	Passed, Failed int
	// Skipped are the selected tests that skipped themselves (a missing capability the test
	// checks for), with the reason they gave.
	Skipped []Failure
	// SkippedByName are the tests that Skips names; NotSelected counts the suite's other tests
	// that the focus left out.
	SkippedByName []string
	NotSelected   int
	// Failures are the failed tests, and failed setup or teardown nodes of the suite
	// ([SynchronizedBeforeSuite] and the like: when they fail, the run did).
	Failures []Failure
}

// notSelected is the skip message of a test that the focus or skip expressions left out.
const notSelected = "skipped"

// Summarize reads a JUnit report (as ginkgo writes it) and counts its tests.
func Summarize(r io.Reader) (Summary, error) {
	var doc junitSuites
	dec := xml.NewDecoder(r)
	if err := dec.Decode(&doc); err != nil {
		return Summary{}, fmt.Errorf("parsing the JUnit report: %w", err)
	}
	skips := compiledSkips()
	var s Summary
	for _, suite := range doc.Suites {
		for _, c := range suite.Cases {
			test := strings.HasPrefix(c.Name, "[It] ")
			name := strings.TrimPrefix(c.Name, "[It] ")
			switch {
			case c.Failure != nil || c.Error != nil:
				m := c.Failure
				if m == nil {
					m = c.Error
				}
				s.Failed++
				s.Failures = append(s.Failures, Failure{Name: name, Reason: firstLine(m.Message, m.Text)})
			case !test:
				// A setup or teardown node that did not fail.
			case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
				byName := false
				for _, re := range skips {
					if re.MatchString(name) {
						byName = true
						break
					}
				}
				switch {
				case byName:
					s.SkippedByName = append(s.SkippedByName, name)
				case c.Skipped == nil || c.Skipped.Message == notSelected:
					s.NotSelected++
				default:
					s.Skipped = append(s.Skipped, Failure{Name: name, Reason: firstLine(c.Skipped.Message, c.Skipped.Text)})
				}
			default:
				s.Passed++
			}
		}
	}
	sort.Slice(s.Failures, func(i, j int) bool { return s.Failures[i].Name < s.Failures[j].Name })
	sort.Slice(s.Skipped, func(i, j int) bool { return s.Skipped[i].Name < s.Skipped[j].Name })
	sort.Strings(s.SkippedByName)
	return s, nil
}

// firstLine is the first non-empty line of the message, else of the text, at most 300 bytes.
func firstLine(msg, text string) string {
	for _, t := range []string{msg, text} {
		for _, l := range strings.Split(t, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				if len(l) > 300 {
					l = l[:300] + "…"
				}
				return l
			}
		}
	}
	return "(no message)"
}

// String is the summary as printed and written under _output.
func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "passed %d, failed %d, skipped %d (by the test itself %d, by name %d); %d of the suite's other tests not selected\n",
		s.Passed, s.Failed, len(s.Skipped)+len(s.SkippedByName), len(s.Skipped), len(s.SkippedByName), s.NotSelected)
	for _, f := range s.Failures {
		fmt.Fprintf(&b, "FAIL %s\n     %s\n", f.Name, f.Reason)
	}
	for _, f := range s.Skipped {
		fmt.Fprintf(&b, "SKIP %s\n     %s\n", f.Name, f.Reason)
	}
	for _, n := range s.SkippedByName {
		fmt.Fprintf(&b, "SKIP %s\n     skipped by name (internal/conformance.Skips, docs/conformance.md)\n", n)
	}
	return b.String()
}
