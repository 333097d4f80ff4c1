package releasedir_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// A directory source whose v0.3.0 is a copy of the genuine, correctly signed v0.2.0 (or a
// directory named otherwise holding it) is refused, naming both versions: a release is
// opened only under its signed version, so nobody who can write the directory can make an
// older release pass for a newer one.
func TestReplayUnderANewerName(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	source := t.TempDir()
	genuine := writeRelease(t, source, "v0.2.0", "b", key)
	for _, name := range []string{"v0.3.0", "latest"} {
		require.NoError(t, os.CopyFS(filepath.Join(source, name), os.DirFS(genuine)))
	}
	policy := release.Policy{Variant: variant.QEMUVTPM}

	for _, name := range []string{"v0.3.0", "latest"} {
		r, err := releasedir.Open(ctx, filepath.Join(source, name), key.Public(), policy, local.ImageDigest)
		require.Error(t, err, name)
		assert.Nil(t, r)
		assert.Equal(t, release.ReasonMisnamed, release.ReasonOf(err), "%v", err)
		assert.ErrorContains(t, err, name)
		assert.ErrorContains(t, err, "signed as v0.2.0")
	}

	listed, err := releasedir.List(ctx, source, key.Public(), policy, local.ImageDigest)
	require.NoError(t, err)
	require.Len(t, listed, 3)
	assert.Equal(t, "v0.2.0", listed[0].Release.Version(), "the genuine one, under its own name")
	for _, l := range listed[1:] {
		assert.Nil(t, l.Release, "%s is never listed as available", l.Dir)
		assert.Equal(t, release.ReasonMisnamed, release.ReasonOf(l.Err), "%v", l.Err)
	}
}
