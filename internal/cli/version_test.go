package cli

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVersion(t *testing.T) {
	orig := buildInfo
	t.Cleanup(func() { buildInfo = orig })
	buildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: "github.com/openconstellation/constellation", Version: "v0.3.0"},
			Settings:  []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}},
		}, true
	}
	out, err := run(t, "version")
	require.NoError(t, err)
	azure := "verified against the SDK's fakes and a simulated cloud; never run against Azure by this project"
	assert.Equal(t, "constellation v0.3.0\n  go:       go1.26.8\n  platform: "+runtime.GOOS+"/"+runtime.GOARCH+"\n  commit:   abc123 (modified)\n"+
		"  provider azure: "+azure+"\n", out)

	out, err = run(t, "version", "-o", "json")
	require.NoError(t, err)
	var v versionInfo
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	assert.Equal(t, versionInfo{Version: "v0.3.0", GoVersion: "go1.26.8", Platform: runtime.GOOS + "/" + runtime.GOARCH, Commit: "abc123", Modified: true,
		Providers: map[string]string{"azure": azure}}, v)

	_, err = run(t, "version", "--output", "yaml")
	assert.ErrorContains(t, err, `unknown output format "yaml" (known: text, json)`)

	// A build without module information (go run of a file, tests) is a devel build.
	buildInfo = func() (*debug.BuildInfo, bool) { return nil, false }
	out, err = run(t, "version", "-o", "json")
	require.NoError(t, err)
	v = versionInfo{}
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	assert.Equal(t, versionInfo{Version: "(devel)", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH, Providers: map[string]string{"azure": azure}}, v)
}
