package releasesource

import (
	"path"
	"strings"
	"testing"
)

// FuzzParseIndex: an index served by a release source never panics the parser, and every name
// it accepts is one path element, listed once: a name becomes a URL path and a directory of
// the workspace.
func FuzzParseIndex(f *testing.F) {
	f.Add([]byte(`{"releases": ["v0.1.0", "v0.2.0"]}`))
	f.Add([]byte(`{"releases": ["../../etc"]}`))
	f.Add([]byte(`{"releases": ["v0.2.0", "v0.2.0"]}`))
	f.Add([]byte(`{"releases": []} {}`))
	f.Add([]byte(`{"releases": ["v1.2.3-rc.1+b.2"], "x": 1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		versions, err := parseIndex(data)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, v := range versions {
			if v == "" || path.Base(v) != v || path.Clean(v) != v || v == ".." || strings.ContainsAny(v, `/\`) || seen[v] {
				t.Fatalf("accepted %q", v)
			}
			seen[v] = true
		}
	})
}
