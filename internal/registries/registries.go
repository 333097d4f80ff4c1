// Package registries is the cluster's container registry configuration: the mirrors of each
// registry host, as constellation-conf.yaml's registryMirrors states them, as the cluster
// records them (ConfigMap kube-system/constellation-registries) and as each node's containerd
// reads them (one hosts.toml per registry host below HostsDir).
//
// The configuration travels only on attested paths: the CLI sends it to the first node in its
// init request, the join service sends it to every node in its join and rejoin tickets. The
// platform never supplies it: whoever chose the mirrors chooses what a tag pulls.
package registries

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// HostsDir is where a node's containerd looks for registry hosts (its registry config_path).
const HostsDir = "/etc/containerd/certs.d"

// Limits of a configuration, so that a recorded or received one stays small.
const (
	MaxHosts          = 32
	MaxMirrorsPerHost = 8
	MaxEncodedSize    = 16 << 10
	maxHostLength     = 253 + 6 // a DNS name and :port
	maxEndpointLength = 512
	hostsFileName     = "hosts.toml"
	pullCapabilities  = `["pull", "resolve"]`
)

// Mirrors maps a registry host ("docker.io", "registry.example.com:5000") to the endpoints a
// node pulls its images from instead, in order ("https://mirror.example.com",
// "http://10.0.2.2:5000"). The registry itself is tried after its mirrors. A plain-HTTP
// registry is configured as its own mirror with an http:// endpoint.
type Mirrors map[string][]string

// hostPattern is a registry host: a DNS name or IPv4 address, with an optional port.
var hostPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?$`)

// Validate reports every problem of m, each naming its host.
func (m Mirrors) Validate() error {
	var problems []error
	if len(m) > MaxHosts {
		problems = append(problems, fmt.Errorf("%d registry hosts, at most %d", len(m), MaxHosts))
	}
	for _, host := range m.Hosts() {
		if err := checkHost(host); err != nil {
			problems = append(problems, err)
			continue
		}
		endpoints := m[host]
		switch {
		case len(endpoints) == 0:
			problems = append(problems, fmt.Errorf("registry %s: no mirror", host))
		case len(endpoints) > MaxMirrorsPerHost:
			problems = append(problems, fmt.Errorf("registry %s: %d mirrors, at most %d", host, len(endpoints), MaxMirrorsPerHost))
		}
		for i, e := range endpoints {
			if err := checkEndpoint(e); err != nil {
				problems = append(problems, fmt.Errorf("registry %s: mirror %d: %w", host, i+1, err))
			} else if slices.Index(endpoints, e) != i {
				problems = append(problems, fmt.Errorf("registry %s: mirror %s listed twice", host, e))
			}
		}
	}
	return errors.Join(problems...)
}

func checkHost(host string) error {
	if len(host) > maxHostLength || !hostPattern.MatchString(host) || strings.Contains(host, "..") {
		return fmt.Errorf("registry %q: want a host name or IPv4 address in lower case, with an optional :port (no scheme, no path)", host)
	}
	if _, port, ok := strings.Cut(host, ":"); ok {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("registry %q: port %s out of range", host, port)
		}
	}
	return nil
}

func checkEndpoint(e string) error {
	if len(e) > maxEndpointLength {
		return fmt.Errorf("%d characters, at most %d", len(e), maxEndpointLength)
	}
	u, err := url.Parse(e)
	if err != nil {
		return fmt.Errorf("%q: %w", e, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: want an http:// or https:// URL", e)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return fmt.Errorf("%q: want scheme://host[:port][/path] only (no credentials, query or fragment)", e)
	case checkHost(u.Host) != nil:
		return fmt.Errorf("%q: host %q: want a host name or IPv4 address in lower case, with an optional :port", e, u.Host)
	case strings.ContainsAny(u.Path, "\"\\ \t\r\n") || strings.Contains(u.Path, ".."):
		return fmt.Errorf("%q: path %q", e, u.Path)
	case e != u.String():
		return fmt.Errorf("%q: not in canonical form (%q)", e, u.String())
	}
	return nil
}

// Hosts returns m's registry hosts, sorted.
func (m Mirrors) Hosts() []string { return slices.Sorted(maps.Keys(m)) }

// Encode returns m's recorded form: JSON with sorted hosts. It validates m first.
func (m Mirrors) Encode() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		m = Mirrors{}
	}
	return json.Marshal(m)
}

// Parse decodes and validates a recorded or received configuration. Empty data is no mirrors.
func Parse(data []byte) (Mirrors, error) {
	if len(data) == 0 {
		return Mirrors{}, nil
	}
	if len(data) > MaxEncodedSize {
		return nil, fmt.Errorf("registry configuration of %d bytes, at most %d", len(data), MaxEncodedSize)
	}
	// strictjson refuses a host twice (encoding/json alone keeps the last list) and anything
	// after the object (a stray "}" too).
	var m Mirrors
	if err := strictjson.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("registry configuration: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("registry configuration: %w", err)
	}
	if m == nil {
		m = Mirrors{}
	}
	return m, nil
}

// HostsTOML returns the hosts.toml of host: one [host."<endpoint>"] table per mirror, for
// pulling, in the configured order (containerd tries them in file order, then the registry
// itself). It is written by hand, not by a TOML encoder: encoders write a table's keys
// sorted, and the order is the configuration. Validate has limited every string to
// characters that need no escaping.
func (m Mirrors) HostsTOML(host string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Mirrors of %s (constellation-conf.yaml registryMirrors), tried in this order.\n", host)
	for _, e := range m[host] {
		fmt.Fprintf(&b, "\n[host.%s]\n  capabilities = %s\n", strconv.Quote(e), pullCapabilities)
	}
	return b.Bytes()
}

// Write makes dir hold exactly m's hosts.toml files (dir/<host>/hosts.toml), removing those of
// hosts m no longer names; dir is created if missing. m must be valid (Parse, Validate).
func Write(dir string, m Mirrors) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("registry configuration: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("registry configuration: %w", err)
	}
	for _, e := range entries {
		if _, keep := m[e.Name()]; !keep {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("registry configuration: %w", err)
			}
		}
	}
	for _, host := range m.Hosts() {
		hostDir := filepath.Join(dir, host)
		if err := os.MkdirAll(hostDir, 0o755); err != nil {
			return fmt.Errorf("registry configuration of %s: %w", host, err)
		}
		if err := fileutil.WriteAtomic(filepath.Join(hostDir, hostsFileName), m.HostsTOML(host), 0o644); err != nil {
			return fmt.Errorf("registry configuration of %s: %w", host, err)
		}
	}
	return nil
}

// Equal reports whether a and b configure the same mirrors (nil and empty alike).
func Equal(a, b Mirrors) bool { return maps.EqualFunc(a, b, slices.Equal[[]string]) }
