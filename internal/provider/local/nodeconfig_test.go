package local_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local"
)

func TestNodeConfig(t *testing.T) {
	good := local.NodeConfig{KubernetesVersion: "v1.34.4", Provider: "local", ServicesImage: "localhost/constellation/services:0123abcd"}
	data, err := good.Marshal()
	require.NoError(t, err)
	assert.Equal(t, `{"kubernetesVersion":"v1.34.4","provider":"local","servicesImage":"localhost/constellation/services:0123abcd"}`+"\n", string(data))
	back, err := local.ParseNodeConfig(data)
	require.NoError(t, err)
	assert.Equal(t, good, back)

	released := good
	released.Release = "v0.2.0"
	data, err = released.Marshal()
	require.NoError(t, err)
	assert.Contains(t, string(data), `"release":"v0.2.0"`, "a release's image says its version (and so measures differently)")
	back, err = local.ParseNodeConfig(data)
	require.NoError(t, err)
	assert.Equal(t, released, back)

	for name, tc := range map[string]struct {
		data string
		want []string
	}{
		"unknown field": {`{"kubernetesVersion":"v1.34.4","provider":"local","servicesImage":"a/b:c","extra":1}`, []string{`unknown field "extra"`}},
		"trailing data": {`{"kubernetesVersion":"v1.34.4","provider":"local","servicesImage":"a/b:c"} {}`, []string{"data after the JSON value"}},
		"stray brace":   {`{"kubernetesVersion":"v1.34.4","provider":"local","servicesImage":"a/b:c"}}`, []string{"data after the JSON value"}},
		"not JSON":      {`kubernetesVersion: v1.34.4`, []string{"decoding node-config.json"}},
		// One reading only: the file is measured, and the measured bytes must mean one thing.
		"field in other case": {`{"kubernetesVersion":"v1.34.4","KubernetesVersion":"v1.33.0","provider":"local","servicesImage":"a/b:c"}`, []string{"letter case"}},
		"field twice":         {`{"kubernetesVersion":"v1.34.4","kubernetesVersion":"v1.33.0","provider":"local","servicesImage":"a/b:c"}`, []string{`duplicate member name "kubernetesVersion"`}},
		"every field bad":     {`{"kubernetesVersion":"1.34","provider":"gcp","servicesImage":"services"}`, []string{`kubernetesVersion "1.34"`, `provider "gcp"`, `servicesImage "services"`}},
		"release not semver":  {`{"kubernetesVersion":"v1.34.4","provider":"local","servicesImage":"a/b:c","release":"2"}`, []string{`release "2"`}},
		"release without v":   {`{"kubernetesVersion":"v1.34.4","provider":"local","servicesImage":"a/b:c","release":"1.2.3"}`, []string{`release "1.2.3"`}},
		"image untagged":      {`{"kubernetesVersion":"v1.34.4","provider":"local","servicesImage":"localhost/constellation/services"}`, []string{"servicesImage"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := local.ParseNodeConfig([]byte(tc.data))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

func FuzzParseNodeConfig(f *testing.F) {
	f.Add([]byte(`{"kubernetesVersion":"v1.34.4","provider":"local","servicesImage":"localhost/constellation/services:0123abcd"}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"kubernetesVersion":"v1.34.4","provider":"local","servicesImage":"localhost/constellation/services:0123abcd","release":"v0.2.0-rc.1"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := local.ParseNodeConfig(data)
		if err != nil {
			return
		}
		again, err := c.Marshal()
		require.NoError(t, err, "what parses, marshals")
		back, err := local.ParseNodeConfig(again)
		require.NoError(t, err)
		assert.Equal(t, c, back)
	})
}
