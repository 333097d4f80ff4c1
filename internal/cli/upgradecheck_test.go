package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/openconstellation/constellation/internal/release"
)

func TestKubernetesSkew(t *testing.T) {
	for name, tc := range map[string]struct {
		current, target string
		wantErr         string
	}{
		"same":             {current: "v1.34.4", target: "v1.34.4"},
		"patch":            {current: "v1.34.3", target: "v1.34.4"},
		"next minor":       {current: "v1.34.4", target: "v1.35.4"},
		"next minor, .0":   {current: "v1.34.4", target: "v1.35.0"},
		"two minors":       {current: "v1.34.4", target: "v1.36.1", wantErr: "skips a minor"},
		"back a patch":     {current: "v1.34.4", target: "v1.34.3", wantErr: "never goes back"},
		"back a minor":     {current: "v1.35.4", target: "v1.34.4", wantErr: "never goes back"},
		"next major":       {current: "v1.34.4", target: "v2.0.0", wantErr: "skips a minor"},
		"not a version":    {current: "v1.34.4", target: "latest", wantErr: `target Kubernetes version "latest"`},
		"current unparsed": {current: "", target: "v1.34.4", wantErr: "current Kubernetes version"},
	} {
		t.Run(name, func(t *testing.T) {
			err := kubernetesSkew(tc.current, tc.target)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestVerdict(t *testing.T) {
	now := running{release: "v0.2.0", kubernetes: "v1.34.4"}
	for _, tc := range []struct {
		m    release.Manifest
		want string
	}{
		{release.Manifest{Version: "v0.2.0", KubernetesVersion: "v1.34.4"}, "running"},
		{release.Manifest{Version: "v0.3.0", KubernetesVersion: "v1.34.4"}, "allowed: upgrade"},
		{release.Manifest{Version: "v0.4.0", KubernetesVersion: "v1.35.4"}, "allowed: upgrade with Kubernetes v1.34.4 -> v1.35.4"},
		{release.Manifest{Version: "v0.5.0", KubernetesVersion: "v1.36.1"}, "refused: the release's Kubernetes v1.36.1 skips a minor version from the running v1.34.4: upgrade one minor at a time"},
	} {
		assert.Equal(t, tc.want, verdict(now, tc.m), tc.m.Version)
	}
}
