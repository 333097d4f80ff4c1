package conformance

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"
)

// multiarch is Debian's library directory name of the build machine's architecture.
var multiarch = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]

// ELFLibraries returns what the dynamically linked program needs to run: its interpreter (the
// dynamic loader) and every shared library it or one of its libraries names (DT_NEEDED),
// resolved in Debian's library directories. A static program needs nothing. A library found
// nowhere is an error naming it.
func ELFLibraries(program string) ([]string, error) {
	dirs := []string{"/lib/" + multiarch, "/usr/lib/" + multiarch, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
	seen := map[string]bool{}
	var out []string
	var visit func(file string) error
	visit = func(file string) error {
		f, err := elf.Open(file)
		if err != nil {
			return fmt.Errorf("reading %s: %w", file, err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			data, err := io.ReadAll(p.Open())
			if err != nil {
				return fmt.Errorf("reading the interpreter of %s: %w", file, err)
			}
			if interp := strings.TrimRight(string(data), "\x00"); !seen[interp] {
				seen[interp] = true
				out = append(out, interp)
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("reading the libraries of %s: %w", file, err)
		}
		for _, name := range needed {
			found := ""
			for _, d := range dirs {
				if _, err := os.Stat(path.Join(d, name)); err == nil {
					found = path.Join(d, name)
					break
				}
			}
			if found == "" {
				return fmt.Errorf("%s needs %s, which is in none of %s", file, name, strings.Join(dirs, ", "))
			}
			if seen[found] {
				continue
			}
			seen[found] = true
			out = append(out, found)
			if err := visit(found); err != nil {
				return err
			}
		}
		return nil
	}
	if err := visit(program); err != nil {
		return nil, err
	}
	return out, nil
}
