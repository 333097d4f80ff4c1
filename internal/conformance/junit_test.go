package conformance

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const report = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="6" disabled="5" errors="0" failures="1" time="12.5">
  <testsuite name="Kubernetes e2e suite" package="/e2e" tests="6" disabled="0" skipped="3" errors="0" failures="1" time="12.5">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.2"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for services  [Conformance]" classname="Kubernetes e2e suite" status="passed" time="8.1"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" classname="Kubernetes e2e suite" status="failed" time="120">
      <failure message="service is not reachable within 2m0s timeout on endpoint endpoint-test2:80 over TCP protocol" type="failed">[FAILED] service is not reachable
In [It] at: service.go:776</failure>
    </testcase>
    <testcase name="[It] [sig-storage] In-tree Volumes [Driver: nfs] subPath" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-node] Pods should have a node with two CPUs" classname="Kubernetes e2e suite" status="skipped" time="0.5"><skipped message="skipped - Requires at least 2 nodes (not 1)"></skipped></testcase>
    <testcase name="[AfterSuite]" classname="Kubernetes e2e suite" status="failed" time="0.1"><failure message="cleanup failed" type="failed">x</failure></testcase>
  </testsuite>
</testsuites>`

func TestSummarize(t *testing.T) {
	s, err := Summarize(strings.NewReader(report))
	require.NoError(t, err)
	assert.Equal(t, 1, s.Passed)
	assert.Equal(t, 2, s.Failed, "the failed test and the failed teardown")
	assert.Equal(t, 1, s.NotSelected)
	assert.Equal(t, []Failure{{Name: "[sig-node] Pods should have a node with two CPUs", Reason: "skipped - Requires at least 2 nodes (not 1)"}}, s.Skipped)
	assert.Equal(t, []Failure{
		{Name: "[AfterSuite]", Reason: "cleanup failed"},
		{Name: "[sig-network] Services should serve a basic endpoint from pods [Conformance]", Reason: "service is not reachable within 2m0s timeout on endpoint endpoint-test2:80 over TCP protocol"},
	}, s.Failures)
	out := s.String()
	assert.Contains(t, out, "passed 1, failed 2, skipped 1 (by the test itself 1, by name 0); 1 of the suite's other tests not selected")
	assert.Contains(t, out, "FAIL [sig-network] Services should serve a basic endpoint from pods [Conformance]\n     service is not reachable")
}

func TestSummarizeRefusesWhatIsNotJUnit(t *testing.T) {
	_, err := Summarize(strings.NewReader("passed 3"))
	assert.Error(t, err)
}

func TestSkipsCompile(t *testing.T) {
	for i, re := range compiledSkips() {
		assert.NotEmpty(t, Skips[i].Reason, "skip %q names no reason", Skips[i].Name)
		assert.NotNil(t, re)
	}
}

func TestSmokeFocus(t *testing.T) {
	re := regexp.MustCompile(SmokeFocus())
	for _, n := range Smoke {
		assert.True(t, re.MatchString(n+" [sig-network, Conformance]"), n)
	}
	assert.False(t, re.MatchString("[sig-network] DNS should provide DNS for services with a long name [Conformance]"), "a longer name that shares a prefix")
	assert.False(t, re.MatchString("[sig-apps] Deployment should run the lifecycle of a Deployment [Conformance]"))
}
