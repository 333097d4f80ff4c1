package registries

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidate(t *testing.T) {
	many := make([]string, MaxMirrorsPerHost+1)
	for i := range many {
		many[i] = "https://m" + string(rune('a'+i)) + ".example.com"
	}
	testCases := map[string]struct {
		m       Mirrors
		wantErr string
	}{
		"none":                       {m: nil},
		"docker hub mirror":          {m: Mirrors{"docker.io": {"https://mirror.gcr.io"}}},
		"plain HTTP registry itself": {m: Mirrors{"10.0.2.2:5000": {"http://10.0.2.2:5000"}}},
		"two mirrors, with a path":   {m: Mirrors{"registry.k8s.io": {"https://a.example.com/v2-proxy", "https://b.example.com:8443"}}},
		"scheme in host":             {m: Mirrors{"https://docker.io": {"https://m.example.com"}}, wantErr: `registry "https://docker.io": want a host name`},
		"upper case host":            {m: Mirrors{"Docker.io": {"https://m.example.com"}}, wantErr: "in lower case"},
		"path in host":               {m: Mirrors{"docker.io/library": {"https://m.example.com"}}, wantErr: "no scheme, no path"},
		"port out of range":          {m: Mirrors{"r.example.com:70000": {"https://m.example.com"}}, wantErr: "port 70000 out of range"},
		"no mirror":                  {m: Mirrors{"docker.io": {}}, wantErr: "registry docker.io: no mirror"},
		"too many mirrors":           {m: Mirrors{"docker.io": many}, wantErr: "9 mirrors, at most 8"},
		"ftp mirror":                 {m: Mirrors{"docker.io": {"ftp://m.example.com"}}, wantErr: "want an http:// or https:// URL"},
		"credentials":                {m: Mirrors{"docker.io": {"https://user:pw@m.example.com"}}, wantErr: "no credentials"},
		"query":                      {m: Mirrors{"docker.io": {"https://m.example.com?x=1"}}, wantErr: "no credentials, query or fragment"},
		"quote in path":              {m: Mirrors{"docker.io": {`https://m.example.com/a"b`}}, wantErr: "path"},
		"not canonical":              {m: Mirrors{"docker.io": {"HTTPS://m.example.com"}}, wantErr: "not in canonical form"},
		"TOML breaking path":         {m: Mirrors{"docker.io": {"https://m.example.com/a\\b"}}, wantErr: "path"},
		"listed twice":               {m: Mirrors{"docker.io": {"https://m.example.com", "https://m.example.com"}}, wantErr: "listed twice"},
		"no host in URL":             {m: Mirrors{"docker.io": {"https:///path"}}, wantErr: `host ""`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			err := tc.m.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				data, err := tc.m.Encode()
				require.NoError(t, err)
				back, err := Parse(data)
				require.NoError(t, err)
				assert.True(t, Equal(tc.m, back), "round trip of %s", data)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
			_, err = tc.m.Encode()
			assert.Error(t, err, "an invalid configuration is never recorded")
		})
	}
}

func TestParse(t *testing.T) {
	for name, tc := range map[string]struct{ data, wantErr string }{
		"empty: none":   {data: ""},
		"empty object":  {data: "{}"},
		"not JSON":      {data: "docker.io: x", wantErr: "invalid character"},
		"wrong type":    {data: `{"docker.io": "https://m.example.com"}`, wantErr: "cannot unmarshal"},
		"trailing data": {data: `{} {}`, wantErr: "data after the JSON value"},
		// A host twice: encoding/json alone kept the last list, a reader keeping the first
		// pulls from other mirrors.
		"host twice": {
			data:    `{"docker.io": ["https://a.example.com"], "docker.io": ["https://b.example.com"]}`,
			wantErr: `duplicate member name "docker.io"`,
		},
		// A stray "}" after the object: encoding/json's More reported no more values.
		"stray closing brace":   {data: `{"docker.io": ["https://a.example.com"]}}`, wantErr: "data after the JSON value"},
		"stray closing bracket": {data: `{}]`, wantErr: "data after the JSON value"},
		"invalid inside":        {data: `{"docker.io": ["ftp://x"]}`, wantErr: "want an http:// or https:// URL"},
		"too large":             {data: `{"a": ["` + strings.Repeat("x", MaxEncodedSize) + `"]}`, wantErr: "at most 16384"},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := Parse([]byte(tc.data))
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				assert.Nil(t, m)
				return
			}
			require.NoError(t, err)
			assert.Empty(t, m)
		})
	}
}

// TestWrite: one hosts.toml per registry, mirrors in the configured order; a host no longer
// configured is removed, and writing no mirrors leaves an empty directory.
func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs.d")
	m := Mirrors{
		"docker.io":     {"https://b.example.com", "https://a.example.com"},
		"10.0.2.2:5000": {"http://10.0.2.2:5000"},
	}
	require.NoError(t, Write(dir, m))
	got, err := os.ReadFile(filepath.Join(dir, "docker.io", "hosts.toml"))
	require.NoError(t, err)
	assert.Equal(t, `# Mirrors of docker.io (constellation-conf.yaml registryMirrors), tried in this order.

[host."https://b.example.com"]
  capabilities = ["pull", "resolve"]

[host."https://a.example.com"]
  capabilities = ["pull", "resolve"]
`, string(got))
	assert.FileExists(t, filepath.Join(dir, "10.0.2.2:5000", "hosts.toml"))

	delete(m, "docker.io")
	require.NoError(t, Write(dir, m))
	assert.NoDirExists(t, filepath.Join(dir, "docker.io"))
	assert.FileExists(t, filepath.Join(dir, "10.0.2.2:5000", "hosts.toml"))

	require.NoError(t, Write(dir, nil))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)

	assert.Error(t, Write(dir, Mirrors{"../etc": {"https://m.example.com"}}), "an invalid host never names a directory")
}

// FuzzParse: a received configuration either fails to parse or is valid, encodes, and writes
// only below the directory it is written to.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"docker.io":["https://mirror.gcr.io"],"10.0.2.2:5000":["http://10.0.2.2:5000"]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"../x":["https://a"]}`))
	f.Add([]byte(`{"a":["https://b/c\"d"]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		require.NoError(t, m.Validate())
		_, err = m.Encode()
		require.NoError(t, err)
		for _, h := range m.Hosts() {
			require.Equal(t, h, filepath.Base(filepath.Clean(h)), "host %q is one directory name", h)
			require.NotContains(t, string(m.HostsTOML(h)), "\n[host.\"\"")
		}
	})
}
