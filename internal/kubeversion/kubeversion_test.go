package kubeversion

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLookup(t *testing.T) {
	testCases := map[string]struct {
		version string
		want    Release
		wantErr string
	}{
		"v1.34.4":     {version: "v1.34.4", want: Release{Kubernetes: "v1.34.4", Etcd: "v3.6.5", CoreDNS: "v1.12.1", Pause: "3.10.1"}},
		"v1.35.4":     {version: "v1.35.4", want: Release{Kubernetes: "v1.35.4", Etcd: "v3.6.6", CoreDNS: "v1.13.1", Pause: "3.10.1"}},
		"unsupported": {version: "v1.33.0", wantErr: `kubernetesVersion "v1.33.0" is not supported (supported: v1.34.4, v1.35.4)`},
		"empty":       {version: "", wantErr: `kubernetesVersion "" is not supported (supported: v1.34.4, v1.35.4)`},
		"no v":        {version: "1.34.4", wantErr: "is not supported"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := Lookup(tc.version)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestReleases(t *testing.T) {
	assert.Equal(t, []string{"v1.34.4", "v1.35.4"}, Versions())
	assert.Contains(t, Versions(), Default)
	rs := Releases()
	rs[0].Kubernetes = "changed"
	assert.Equal(t, "v1.34.4", Releases()[0].Kubernetes, "callers get a copy")
	assert.Equal(t, "3.6.5-0", Releases()[0].EtcdTag())

	prev := -1
	for _, r := range Releases() {
		minor, err := Minor(r.Kubernetes)
		require.NoError(t, err, r.Kubernetes)
		assert.Greater(t, minor, prev, "oldest first, one release per minor")
		prev = minor
		for _, v := range []string{r.Etcd, r.CoreDNS} {
			assert.Regexp(t, `^v\d+\.\d+\.\d+$`, v)
		}
		assert.Regexp(t, `^\d+\.\d+(\.\d+)?$`, r.Pause)
	}
}

func TestMinor(t *testing.T) {
	for v, want := range map[string]int{"v1.34.4": 34, "v1.35.0": 35, "v1.100.2": 100} {
		got, err := Minor(v)
		require.NoError(t, err, v)
		assert.Equal(t, want, got, v)
	}
	for _, bad := range []string{"", "1.34.4", "v1.34", "v2.0.0", "v1.034.4", "v1.34.4-rc.0"} {
		_, err := Minor(bad)
		assert.Error(t, err, bad)
	}
}

// TestPinModules: the build scripts build each version from its pin module under tools/, so
// there is one module per version of the table, pinning exactly that version, and no other.
func TestPinModules(t *testing.T) {
	tools := filepath.Join("..", "..", "tools")
	var kube, etcd, coredns []string
	for _, r := range Releases() {
		kube = append(kube, r.Kubernetes)
		if !slices.Contains(etcd, r.Etcd) {
			etcd = append(etcd, r.Etcd)
		}
		if !slices.Contains(coredns, r.CoreDNS) {
			coredns = append(coredns, r.CoreDNS)
		}
	}
	testCases := map[string]struct {
		dir      string
		versions []string
		module   string
	}{
		"kube":    {dir: "kube", versions: kube, module: "k8s.io/kubernetes"},
		"etcd":    {dir: "etcd", versions: etcd, module: "go.etcd.io/etcd/server/v3"},
		"coredns": {dir: "coredns", versions: coredns, module: "github.com/coredns/coredns"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			entries, err := os.ReadDir(filepath.Join(tools, tc.dir))
			require.NoError(t, err)
			var dirs []string
			for _, e := range entries {
				dirs = append(dirs, e.Name())
			}
			assert.ElementsMatch(t, tc.versions, dirs, "tools/%s has a pin module per version of the table, and no other", tc.dir)
			for _, v := range tc.versions {
				data, err := os.ReadFile(filepath.Join(tools, tc.dir, v, "go.mod"))
				require.NoError(t, err)
				require := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(tc.module) + `\s+(\S+)\s*$`)
				m := require.FindSubmatch(data)
				if assert.NotNil(t, m, "tools/%s/%s/go.mod requires %s", tc.dir, v, tc.module) {
					assert.Equal(t, v, string(m[1]), "tools/%s/%s/go.mod", tc.dir, v)
				}
				module := regexp.MustCompile(`(?m)^module\s+(\S+)$`).FindSubmatch(data)
				if assert.NotNil(t, module) {
					assert.Equal(t, "github.com/openconstellation/constellation/tools/"+tc.dir+"/"+v, string(module[1]))
				}
			}
		})
	}
}
