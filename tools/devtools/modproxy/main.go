// Command modproxy writes a module of this repository into a file-based Go module proxy
// (GOPROXY=file://DIR), so that a separate consumer module depends on it exactly as a
// relying party would through proxy.golang.org: from the module's zip and go.mod alone,
// without replace lines or the rest of the repository. It prints the version it wrote.
//
//	modproxy -module-dir pkg -out /tmp/proxy
//
// The version is a pseudo-version whose revision part is a hash of the module's zip, so a new
// content gets a new version and never meets a stale copy in the module cache.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	dir := flag.String("module-dir", "", "directory of the module (holding its go.mod)")
	out := flag.String("out", "", "directory of the file-based proxy to write into")
	flag.Parse()
	if *dir == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: modproxy -module-dir DIR -out PROXYDIR")
		os.Exit(2)
	}
	version, err := write(*dir, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
	fmt.Println(version)
}

func write(dir, out string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return "", fmt.Errorf("%s/go.mod names no module", dir)
	}
	// The zip's file names carry the version: zip once to hash the content, then again.
	draft, err := zipOf(dir, module.Version{Path: path, Version: "v0.0.0-00010101000000-000000000000"})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(draft)
	at := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	version := module.PseudoVersion("v0", "", at, hex.EncodeToString(sum[:])[:12])
	body, err := zipOf(dir, module.Version{Path: path, Version: version})
	if err != nil {
		return "", err
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(out, escaped, "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, at})
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{version + ".info": info, version + ".mod": gomod, version + ".zip": body, "list": []byte(version + "\n")} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	return version, nil
}

func zipOf(dir string, v module.Version) ([]byte, error) {
	var buf bytes.Buffer
	if err := zip.CreateFromDir(&buf, v, dir); err != nil {
		return nil, fmt.Errorf("zipping %s: %w", dir, err)
	}
	return buf.Bytes(), nil
}
