package releasesource

import (
	"path"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseListing(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	good := sum + "  kubelet\n" + sum + "  images/services.tar\n"
	files, err := parseListing([]byte(good))
	require.NoError(t, err)
	assert.Equal(t, []listed{{"kubelet", sum}, {"images/services.tar", sum}}, files)
	for name, bad := range map[string]string{
		"a path up":         sum + "  ../../etc/passwd\n",
		"an absolute path":  sum + "  /etc/passwd\n",
		"a deeper path":     sum + "  images/a/b.tar\n",
		"a hidden file":     sum + "  .ssh\n",
		"the listing":       sum + "  SHA256SUMS\n",
		"twice":             sum + "  kubelet\n" + sum + "  kubelet\n",
		"a short sum":       "abcd  kubelet\n",
		"upper-case hex":    strings.ToUpper(sum) + "  kubelet\n",
		"one space":         sum + " kubelet\n",
		"nothing":           "",
		"a name with space": sum + "  kube let\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseListing([]byte(bad))
			assert.Error(t, err)
		})
	}
}

// FuzzParseListing: a listing served by a release source never panics the parser, and what
// it accepts names only files of the node image.
func FuzzParseListing(f *testing.F) {
	sum := strings.Repeat("ab", 32)
	f.Add([]byte(sum + "  kubelet\n" + sum + "  images/services.tar\n"))
	f.Add([]byte(sum + "  ../../etc/passwd\n"))
	f.Add([]byte(""))
	f.Add([]byte(sum + "  kubelet\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		files, err := parseListing(data)
		if err != nil {
			return
		}
		for _, f := range files {
			dir, file := path.Split(f.name)
			if (dir != "" && dir != "images/") || file == "" || strings.HasPrefix(file, ".") || path.Clean(f.name) != f.name {
				t.Fatalf("accepted a name outside the node image: %q", f.name)
			}
			if len(f.sha256) != 64 {
				t.Fatalf("accepted a short sum: %q", f.sha256)
			}
		}
	})
}
