package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/openconstellation/constellation/internal/release"
)

func TestVerdict(t *testing.T) {
	now := running{release: "v0.2.0", kubernetes: "v1.34.4"}
	for _, tc := range []struct {
		m    release.Manifest
		want string
	}{
		{release.Manifest{Version: "v0.2.0", KubernetesVersion: "v1.34.4"}, "running"},
		{release.Manifest{Version: "v0.3.0", KubernetesVersion: "v1.34.4"}, "allowed: upgrade"},
		{release.Manifest{Version: "v0.4.0", KubernetesVersion: "v1.35.4"}, "allowed: upgrade with Kubernetes v1.34.4 -> v1.35.4"},
		{release.Manifest{Version: "v0.5.0", KubernetesVersion: "v1.36.1"}, "refused: the release's Kubernetes version v1.36.1 skips a minor version from the running v1.34.4: upgrade one minor at a time"},
	} {
		assert.Equal(t, tc.want, verdict(now, tc.m), tc.m.Version)
	}
}
