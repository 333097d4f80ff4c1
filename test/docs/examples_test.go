// Package docs_test keeps the Go code shown in docs/ and README.md compiled: every ```go block
// must be part of an Example function of the repository's tests (which `go test` compiles, and
// runs when it has an Output comment), so a shown call that no longer compiles fails here.
package docs_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repoRoot is the repository root, two levels up from this package.
const repoRoot = "../.."

// TestDocExamplesAreCompiled: the lines of every ```go block of docs/*.md and README.md
// appear, in order, in the body of one Example function; a line "..." in a block stands for
// any lines of the example, and comments (whole lines or trailing) are not compared.
func TestDocExamplesAreCompiled(t *testing.T) {
	examples := exampleBodies(t)
	require.NotEmpty(t, examples, "no Example functions found")
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	docs = append(docs, filepath.Join(repoRoot, "README.md"))
	blocks := 0
	for _, doc := range docs {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, block := range goBlocks(string(text)) {
			blocks++
			name, ok := foundIn(block, examples)
			assert.True(t, ok, "%s: this ```go block is in no Example function (write it as one, or show it from one):\n%s", filepath.Base(doc), strings.Join(block, "\n"))
			if ok {
				t.Logf("%s: block compiled in %s", filepath.Base(doc), name)
			}
		}
	}
	require.NotZero(t, blocks, "no ```go block in docs: the check would pass for nothing")
}

// TestMatching pins the matcher: order, gaps only at "...", comments ignored.
func TestMatching(t *testing.T) {
	examples := map[string][]string{"Example": normalize("a := 1\n// said\nb := f(a) // why\nc(b)\nd()")}
	for block, want := range map[string]bool{
		"a := 1\nb := f(a)":                true,
		"a := 1\n...\nc(b)":                true,
		"a := 1\nc(b)":                     false,
		"b := f(a)\na := 1":                false,
		"a := 1 // other words\nb := f(a)": true,
		"x := 2":                           false,
	} {
		_, ok := foundIn(normalize(block), examples)
		assert.Equal(t, want, ok, block)
	}
}

// exampleBodies returns the normalized body lines of every Example function in the tests of
// pkg/ and internal/, by name.
func exampleBodies(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, dir := range []string{"pkg", "internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, src, 0)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Example") {
					continue
				}
				body := src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset]
				out[path+":"+fn.Name.Name] = normalize(string(body))
			}
			return nil
		})
		require.NoError(t, err)
	}
	return out
}

var fence = regexp.MustCompile("(?ms)^```go\n(.*?)^```")

// goBlocks returns the normalized lines of every ```go block of a Markdown text.
func goBlocks(text string) [][]string {
	var out [][]string
	for _, m := range fence.FindAllStringSubmatch(text, -1) {
		out = append(out, normalize(m[1]))
	}
	return out
}

// normalize trims lines, drops empty and comment-only lines and trailing comments.
func normalize(code string) []string {
	var out []string
	for _, line := range strings.Split(code, "\n") {
		if i := strings.Index(line, " //"); i >= 0 && !strings.Contains(line[:i], "\"") {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		out = append(out, line)
	}
	return out
}

// foundIn reports whether block's lines occur in order in one example, contiguously except
// where block has a "..." line.
func foundIn(block []string, examples map[string][]string) (string, bool) {
	for name, body := range examples {
		for start := range body {
			if matchAt(block, body[start:]) {
				return name, true
			}
		}
	}
	return "", false
}

func matchAt(block, body []string) bool {
	if len(block) == 0 {
		return true
	}
	if block[0] == "..." {
		for i := range len(body) + 1 {
			if matchAt(block[1:], body[i:]) {
				return true
			}
		}
		return false
	}
	return len(body) > 0 && bytes.Equal([]byte(block[0]), []byte(body[0])) && matchAt(block[1:], body[1:])
}
