package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/internal/strictyaml"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

func digest(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func hexOf(b byte) string {
	return strings.Repeat(string("0123456789abcdef"[b>>4])+string("0123456789abcdef"[b&0xf]), 32)
}

const validYAML = `version: v1
name: demo
kubernetesVersion: v1.34.4
provider:
  local:
    controlPlanes: 3
    workers: 2
    image: image
attestation:
  qemuVTPM:
    measurements:
    - name: local-1
      measurements:
        "0": "0000000000000000000000000000000000000000000000000000000000000000"
        "1": "0000000000000000000000000000000000000000000000000000000000000000"
        "2": "0000000000000000000000000000000000000000000000000000000000000000"
        "3": "0000000000000000000000000000000000000000000000000000000000000000"
        "4": "0000000000000000000000000000000000000000000000000000000000000000"
        "5": "0000000000000000000000000000000000000000000000000000000000000000"
        "6": "0000000000000000000000000000000000000000000000000000000000000000"
        "7": "0000000000000000000000000000000000000000000000000000000000000000"
        "8": "0000000000000000000000000000000000000000000000000000000000000000"
        "9": "0000000000000000000000000000000000000000000000000000000000000000"
        "10": "0000000000000000000000000000000000000000000000000000000000000000"
        "11": "ABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABAB"
        12: {expected: "1111111111111111111111111111111111111111111111111111111111111111", warnOnly: false}
        "13": "0000000000000000000000000000000000000000000000000000000000000000"
        "14": "0000000000000000000000000000000000000000000000000000000000000000"
network:
  podCIDR: 10.244.0.0/16
  serviceCIDR: 10.96.0.0/12
`

// fullSetYAML renders the measurements of a valid set in YAML flow style: PCRs 0..14,
// zero unless given.
func fullSetYAML(values map[uint32]string) string {
	parts := make([]string, 0, 15)
	for i := range uint32(15) {
		val, ok := values[i]
		if !ok {
			val = hexOf(0)
		}
		parts = append(parts, fmt.Sprintf("%q: %q", fmt.Sprint(i), val))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func validConfig() *Config {
	return &Config{
		Version: "v1", Name: "demo", KubernetesVersion: "v1.34.4",
		Provider: ProviderFor("local", ProviderBlock{ControlPlanes: 3, Workers: 2, Image: "image"}),
		Attestation: AttestationFor(variant.QEMUVTPM, VariantConfig{Measurements: measurements.ReferenceSets{{
			Name: "local-1", Measurements: measurementstest.Image(variant.QEMUVTPM, map[uint32][]byte{11: digest(0xab), 12: digest(0x11)}),
		}}}),
		Network: NetworkConfig{PodCIDR: "10.244.0.0/16", ServiceCIDR: "10.96.0.0/12", Outbound: OutboundNAT},
	}
}

// problems maps field paths to messages.
func problems(t *testing.T, err error) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fes := strictyaml.FieldErrors(err)
	for _, fe := range fes {
		out[fe.Path] = append(out[fe.Path], fe.Err.Error())
	}
	// Every problem is a field error: nothing is reported without its field.
	require.Len(t, fes, len(strings.Split(err.Error(), "\n")), "%v", err)
	return out
}

func TestParseValid(t *testing.T) {
	c, err := Parse([]byte(validYAML))
	require.NoError(t, err)
	assert.Equal(t, validConfig(), c)
	require.NoError(t, c.Validate())
}

func TestParseRegistryMirrors(t *testing.T) {
	c, err := Parse([]byte(validYAML + "registryMirrors:\n  docker.io: [https://b.example.com, https://a.example.com]\n  \"10.0.2.2:5000\": [http://10.0.2.2:5000]\n"))
	require.NoError(t, err)
	assert.Equal(t, registries.Mirrors{"docker.io": {"https://b.example.com", "https://a.example.com"}, "10.0.2.2:5000": {"http://10.0.2.2:5000"}}, c.RegistryMirrors)
	require.NoError(t, c.Validate())
	out, err := c.Marshal()
	require.NoError(t, err)
	back, err := Parse(out)
	require.NoError(t, err)
	assert.Equal(t, c.RegistryMirrors, back.RegistryMirrors, "written as read: %s", out)

	_, err = Parse([]byte(validYAML + "registryMirrors:\n  docker.io: https://a.example.com\n"))
	assert.ErrorContains(t, err, "registryMirrors")
}

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte("version: v1\nname: demo\nprovider: {local: {controlPlanes: 1, image: img}}\n" +
		"attestation: {qemuVTPM: {measurements: [{name: a, measurements: " + fullSetYAML(map[uint32]string{11: hexOf(1)}) + "}]}}\n"))
	require.NoError(t, err)
	assert.Equal(t, DefaultKubernetesVersion, c.KubernetesVersion)
	assert.Equal(t, NetworkConfig{PodCIDR: DefaultPodCIDR, ServiceCIDR: DefaultServiceCIDR, Outbound: OutboundNAT}, c.Network)
	assert.Equal(t, 0, c.Provider.Block().Workers)
	require.NoError(t, c.Validate())

	d := Default()
	assert.Equal(t, &Config{Version: "v1", KubernetesVersion: "v1.34.4", Network: NetworkConfig{PodCIDR: "10.244.0.0/16", ServiceCIDR: "10.96.0.0/12", Outbound: OutboundNAT}}, d)
}

// TestParseRejects: each malformed input names the field at fault.
func TestParseRejects(t *testing.T) {
	testCases := map[string]struct {
		edit     func(string) string
		wantPath string
		wantMsg  string
	}{
		"unknown top-level field": {
			edit:     func(s string) string { return s + "extra: 1\n" },
			wantPath: "extra", wantMsg: "unknown field",
		},
		"typo in provider field": {
			edit:     func(s string) string { return strings.Replace(s, "workers:", "wokers:", 1) },
			wantPath: "provider.local.wokers", wantMsg: "unknown field (known: controlPlanes, image, settings, workers)",
		},
		"miscased field": {
			edit:     func(s string) string { return strings.Replace(s, "controlPlanes:", "controlplanes:", 1) },
			wantPath: "provider.local.controlplanes", wantMsg: `did you mean "controlPlanes"`,
		},
		"unknown provider": {
			edit:     func(s string) string { return strings.Replace(s, "  local:", "  gcp:", 1) },
			wantPath: "provider.gcp", wantMsg: "unknown field (known: local)",
		},
		"unknown field in a reference set": {
			edit: func(s string) string {
				return strings.Replace(s, "    - name: local-1\n", "    - name: local-1\n      comment: x\n", 1)
			},
			wantPath: "attestation.qemuVTPM.measurements[0].comment", wantMsg: "unknown field",
		},
		"unknown field in a measurement": {
			edit:     func(s string) string { return strings.Replace(s, "warnOnly: false", "warnonly: false", 1) },
			wantPath: "attestation.qemuVTPM.measurements[0].measurements", wantMsg: `unknown field "warnonly"`,
		},
		"unquoted all-digit digest": {
			edit: func(s string) string {
				return strings.Replace(s, `"1111111111111111111111111111111111111111111111111111111111111111"`, strings.Repeat("1", 64), 1)
			},
			wantPath: "attestation.qemuVTPM.measurements[0].measurements", wantMsg: "quote digests that are all digits",
		},
		"unknown attestation variant": {
			edit:     func(s string) string { return strings.Replace(s, "  qemuVTPM:", "  qemuSEV:", 1) },
			wantPath: "attestation.qemuSEV", wantMsg: "unknown field (known: awsNitroTPM, awsSEVSNP, azureSEVSNP, azureTDX, azureTrustedLaunch, gcpSEVES, gcpSEVSNP, qemuTDX, qemuVTPM)",
		},
		"miscased attestation variant": {
			edit:     func(s string) string { return strings.Replace(s, "  qemuVTPM:", "  qemuvtpm:", 1) },
			wantPath: "attestation.qemuvtpm", wantMsg: `unknown field (did you mean "qemuVTPM"?)`,
		},
		"attestation variant of the wrong kind": {
			edit: func(s string) string {
				return strings.Replace(s, "    - name: local-1\n", "    - name: [local-1]\n", 1)
			},
			wantPath: "attestation.qemuVTPM.measurements[0].name", wantMsg: "must be a string, got a list",
		},
		"count as a string": {
			edit:     func(s string) string { return strings.Replace(s, "controlPlanes: 3", `controlPlanes: "3"`, 1) },
			wantPath: "provider.local.controlPlanes", wantMsg: "must be an integer",
		},
		"version as a number": {
			edit:     func(s string) string { return strings.Replace(s, "version: v1", "version: 1", 1) },
			wantPath: "version", wantMsg: "must be a string, got the number 1",
		},
		"name as a boolean": {
			edit:     func(s string) string { return strings.Replace(s, "name: demo", "name: no", 1) },
			wantPath: "name", wantMsg: "got the boolean false",
		},
		"not a mapping": {
			edit:     func(string) string { return "- a\n" },
			wantPath: "", wantMsg: "must be a mapping",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.edit(validYAML)))
			require.Error(t, err)
			got := problems(t, err)
			require.Len(t, got, 1, "%v", err)
			require.Contains(t, got, tc.wantPath, "%v", err)
			assert.Contains(t, got[tc.wantPath][0], tc.wantMsg)
		})
	}

	for name, data := range map[string]string{
		"duplicate key": validYAML + "name: other\n",
		"empty":         "",
		"syntax":        "version: [v1\n",
		"two documents": validYAML + "---\n" + validYAML,
		"too large":     validYAML + "#" + strings.Repeat("x", MaxFileSize),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(data))
			assert.Error(t, err)
		})
	}
}

// TestValidate: each invalid field gives its own error, named by its path.
func TestValidate(t *testing.T) {
	caPEM := testCA(t)
	testCases := map[string]struct {
		edit func(*Config)
		// want maps each field path to a fragment of its message; exactly these are reported.
		want map[string]string
	}{
		"valid":                 {edit: func(*Config) {}},
		"valid with AK roots":   {edit: func(c *Config) { c.Attestation.Of(variant.QEMUVTPM).AKRoots = caPEM + caPEM }},
		"valid without workers": {edit: func(c *Config) { c.Provider.Block().Workers = 0 }},
		"valid without NAT":     {edit: func(c *Config) { c.Network.Outbound = OutboundNone }},
		"valid with mirrors": {edit: func(c *Config) {
			c.RegistryMirrors = registries.Mirrors{"docker.io": {"https://mirror.gcr.io"}, "10.0.2.2:5000": {"http://10.0.2.2:5000"}}
		}},
		"bad mirror": {
			edit: func(c *Config) { c.RegistryMirrors = registries.Mirrors{"docker.io": {"ftp://m.example.com"}} },
			want: map[string]string{"registryMirrors": "registry docker.io: mirror 1"},
		},
		"valid with the host's loopback": {edit: func(c *Config) { c.Network.HostLoopback = true }},
		"unknown outbound": {
			edit: func(c *Config) { c.Network.Outbound = "proxy" },
			want: map[string]string{"network.outbound": `"proxy": want nat or none`},
		},
		"host loopback without NAT": {
			edit: func(c *Config) { c.Network.Outbound, c.Network.HostLoopback = OutboundNone, true },
			want: map[string]string{"network.hostLoopback": "needs network.outbound nat"},
		},
		// Valid as a file: the local provider adds its AK CA at apply, which then refuses
		// the opt-in beside roots (choose.NewValidator).
		"valid with the opt-in to unauthenticated AKs": {edit: func(c *Config) { c.Attestation.Of(variant.QEMUVTPM).AcceptUnauthenticatedAK = true }},
		"opt-in beside AK roots": {
			edit: func(c *Config) {
				c.Attestation.Of(variant.QEMUVTPM).AKRoots, c.Attestation.Of(variant.QEMUVTPM).AcceptUnauthenticatedAK = caPEM, true
			},
			want: map[string]string{"attestation.qemuVTPM.acceptUnauthenticatedAK": "the opt-in would be ignored"},
		},
		"valid with several sets": {edit: func(c *Config) {
			c.Attestation.Of(variant.QEMUVTPM).Measurements = append(c.Attestation.Of(variant.QEMUVTPM).Measurements, measurements.ReferenceSet{Name: "local-2", Measurements: measurementstest.Image(variant.QEMUVTPM, map[uint32][]byte{11: digest(2)})})
		}},
		"two variants": {
			edit: func(c *Config) {
				c.Attestation[variant.AzureTrustedLaunch.ConfigKey()] = c.Attestation.Of(variant.QEMUVTPM)
			},
			want: map[string]string{"attestation": "qemuVTPM and azureTrustedLaunch are configured: configure exactly one variant"},
		},
		"a variant the provider's nodes do not attest with": {
			edit: func(c *Config) {
				c.Attestation = AttestationFor(variant.AzureTrustedLaunch, *c.Attestation.Of(variant.QEMUVTPM))
			},
			want: map[string]string{"attestation.azureTrustedLaunch": "variant azure-trustedlaunch does not match the provider's nodes, which attest with qemu-vtpm (attestation.qemuVTPM)"},
		},
		"a setting the provider does not take": {
			edit: func(c *Config) { c.Provider.Block().Settings = map[string]any{"location": "westeurope"} },
			want: map[string]string{"provider.local.settings.location": "unknown setting: the local and QEMU providers take no settings"},
		},
		"null variant block": {
			edit: func(c *Config) { c.Attestation[variant.QEMUVTPM.ConfigKey()] = nil },
			want: map[string]string{"attestation": "no attestation variant configured (the local provider's nodes attest with qemu-vtpm (attestation.qemuVTPM))"},
		},
		// Parse refuses such keys (TestParseRejects); a configuration built in Go is checked
		// alike.
		"unknown variant key": {
			edit: func(c *Config) {
				c.Attestation = AttestationConfig{"qemuvtpm": c.Attestation.Of(variant.QEMUVTPM)}
			},
			want: map[string]string{"attestation.qemuvtpm": `unknown attestation variant (did you mean "qemuVTPM"?)`},
		},
		"unknown variant key beside a known one": {
			edit: func(c *Config) { c.Attestation["sgx"] = c.Attestation.Of(variant.QEMUVTPM) },
			want: map[string]string{
				"attestation.sgx": "unknown attestation variant (known: awsNitroTPM, awsSEVSNP, azureSEVSNP, azureTDX, azureTrustedLaunch, gcpSEVES, gcpSEVSNP, qemuTDX, qemuVTPM)",
				"attestation":     "qemuVTPM and sgx are configured: configure exactly one variant",
			},
		},
		"version missing":     {edit: func(c *Config) { c.Version = "" }, want: map[string]string{"version": "missing (this CLI reads v1)"}},
		"version unsupported": {edit: func(c *Config) { c.Version = "v2" }, want: map[string]string{"version": `"v2" is not supported`}},
		"name missing":        {edit: func(c *Config) { c.Name = "" }, want: map[string]string{"name": "missing"}},
		"name upper case":     {edit: func(c *Config) { c.Name = "Demo" }, want: map[string]string{"name": `"Demo" is not a DNS label`}},
		"name too long":       {edit: func(c *Config) { c.Name = strings.Repeat("a", 64) }, want: map[string]string{"name": "no more than 63"}},
		"name with a dot":     {edit: func(c *Config) { c.Name = "a.b" }, want: map[string]string{"name": "not a DNS label"}},
		"kubernetes v1.35.4":  {edit: func(c *Config) { c.KubernetesVersion = "v1.35.4" }},
		"kubernetes v1.34.4":  {edit: func(c *Config) { c.KubernetesVersion = "v1.34.4" }},
		"kubernetes version": {
			edit: func(c *Config) { c.KubernetesVersion = "v1.33.0" },
			want: map[string]string{"kubernetesVersion": `"v1.33.0" is not supported (supported: v1.34.4, v1.35.4)`},
		},
		"no provider": {edit: func(c *Config) { c.Provider = nil }, want: map[string]string{"provider": "no provider configured (supported: local)"}},
		"null provider block": {
			edit: func(c *Config) { c.Provider["local"] = nil },
			want: map[string]string{"provider": "no provider configured (supported: local)"},
		},
		"two providers": {
			edit: func(c *Config) { c.Provider["gcp"] = &ProviderBlock{ControlPlanes: 1, Image: "image"} },
			want: map[string]string{"provider": "gcp and local are configured: configure exactly one provider"},
		},
		// Parse refuses such keys (TestParseRejects); a configuration built in Go is checked
		// alike.
		"unregistered provider": {
			edit: func(c *Config) { c.Provider = ProviderFor("gcp", *c.Provider.Block()) },
			want: map[string]string{"provider.gcp": `this program has no rules for provider "gcp" (registered: local)`},
		},
		"no control planes": {
			edit: func(c *Config) { c.Provider.Block().ControlPlanes = 0 },
			want: map[string]string{"provider.local.controlPlanes": "must be at least 1, got 0"},
		},
		"negative workers": {
			edit: func(c *Config) { c.Provider.Block().Workers = -1 },
			want: map[string]string{"provider.local.workers": "must be at least 0, got -1"},
		},
		"too many nodes": {
			edit: func(c *Config) { c.Provider.Block().Workers = 243; c.Network.PodCIDR = "10.128.0.0/12" },
			want: map[string]string{"provider.local": "246 nodes, more than the 245 addresses"},
		},
		"image missing": {edit: func(c *Config) { c.Provider.Block().Image = "" }, want: map[string]string{"provider.local.image": "missing"}},
		"no attestation": {
			edit: func(c *Config) { delete(c.Attestation, variant.QEMUVTPM.ConfigKey()) },
			want: map[string]string{"attestation": "no attestation variant configured"},
		},
		"no reference sets": {
			edit: func(c *Config) { c.Attestation.Of(variant.QEMUVTPM).Measurements = nil },
			want: map[string]string{"attestation.qemuVTPM.measurements": "at least one reference-value set"},
		},
		"set without name": {
			edit: func(c *Config) { c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Name = "" },
			want: map[string]string{"attestation.qemuVTPM.measurements[0].name": "missing"},
		},
		"duplicate set name": {
			edit: func(c *Config) {
				c.Attestation.Of(variant.QEMUVTPM).Measurements = append(c.Attestation.Of(variant.QEMUVTPM).Measurements, c.Attestation.Of(variant.QEMUVTPM).Measurements[0])
			},
			want: map[string]string{"attestation.qemuVTPM.measurements[1].name": `"local-1" is also the name of set 0`},
		},
		"register out of range": {
			edit: func(c *Config) {
				c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements[24] = measurements.Measurement{Expected: digest(1)}
			},
			want: map[string]string{"attestation.qemuVTPM.measurements[0].measurements": "PCR 24: index out of range"},
		},
		"digest too short": {
			edit: func(c *Config) {
				c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements[11] = measurements.Measurement{Expected: []byte{1}}
			},
			want: map[string]string{"attestation.qemuVTPM.measurements[0].measurements": "PCR 11: expected digest has 1 bytes"},
		},
		"no enforced register": {
			edit: func(c *Config) {
				for i, m := range c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements {
					c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements[i] = measurements.Measurement{Expected: m.Expected, WarnOnly: true}
				}
			},
			want: map[string]string{"attestation.qemuVTPM.measurements[0].measurements": `set "local-1": PCR 0, PCR 1, PCR 2, PCR 3, PCR 4, PCR 5, PCR 6, PCR 7, PCR 8, PCR 9, PCR 10, PCR 11, PCR 12, PCR 13, PCR 14 warn-only`},
		},
		"enforced PCR 15": {
			edit: func(c *Config) {
				c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements[15] = measurements.Measurement{Expected: digest(0)}
			},
			want: map[string]string{"attestation.qemuVTPM.measurements[0].measurements": `set "local-1": PCR 15 must not be in a reference set`},
		},
		"warn-only PCR 15": {
			edit: func(c *Config) {
				c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements[15] = measurements.Measurement{Expected: digest(0), WarnOnly: true}
			},
			want: map[string]string{"attestation.qemuVTPM.measurements[0].measurements": `set "local-1": PCR 15 must not be in a reference set`},
		},
		"bootstrapper register warn-only": {
			edit: func(c *Config) {
				c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements[11] = measurements.Measurement{Expected: digest(0xab), WarnOnly: true}
			},
			want: map[string]string{"attestation.qemuVTPM.measurements[0].measurements": `set "local-1": PCR 11 warn-only`},
		},
		"AK roots not PEM": {
			edit: func(c *Config) { c.Attestation.Of(variant.QEMUVTPM).AKRoots = "hello" },
			want: map[string]string{"attestation.qemuVTPM.akRoots": "no PEM certificate found"},
		},
		"AK roots with trailing text": {
			edit: func(c *Config) { c.Attestation.Of(variant.QEMUVTPM).AKRoots = caPEM + "junk" },
			want: map[string]string{"attestation.qemuVTPM.akRoots": "not PEM after certificate 1"},
		},
		"AK roots with a key": {
			edit: func(c *Config) {
				c.Attestation.Of(variant.QEMUVTPM).AKRoots = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
			},
			want: map[string]string{"attestation.qemuVTPM.akRoots": `"PRIVATE KEY", want CERTIFICATE`},
		},
		"AK roots broken certificate": {
			edit: func(c *Config) {
				c.Attestation.Of(variant.QEMUVTPM).AKRoots = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
			},
			want: map[string]string{"attestation.qemuVTPM.akRoots": "PEM block 1"},
		},
		"pod CIDR missing": {edit: func(c *Config) { c.Network.PodCIDR = "" }, want: map[string]string{"network.podCIDR": "missing"}},
		"pod CIDR not a CIDR": {
			edit: func(c *Config) { c.Network.PodCIDR = "10.244.0.0" },
			want: map[string]string{"network.podCIDR": "not a CIDR"},
		},
		"pod CIDR host bits": {
			edit: func(c *Config) { c.Network.PodCIDR = "10.244.1.0/16" },
			want: map[string]string{"network.podCIDR": "has host bits set (the network is 10.244.0.0/16)"},
		},
		"pod CIDR IPv6": {
			edit: func(c *Config) { c.Network.PodCIDR = "fd00::/64" },
			want: map[string]string{"network.podCIDR": "not an IPv4 network"},
		},
		"pod CIDR smaller than a node's": {
			edit: func(c *Config) { c.Network.PodCIDR = "10.244.0.0/25" },
			want: map[string]string{"network.podCIDR": "smaller than the /24 each local node gets"},
		},
		"pod CIDR too small for the nodes": {
			edit: func(c *Config) { c.Network.PodCIDR = "10.244.0.0/22" },
			want: map[string]string{"network.podCIDR": "holds 4 node networks (/24), the cluster has 5 nodes"},
		},
		"pod CIDR overlaps node network": {
			edit: func(c *Config) { c.Network.PodCIDR = "10.42.0.0/16" },
			want: map[string]string{"network.podCIDR": "overlaps the local provider's node network 10.42.0.0/24"},
		},
		"service CIDR overlaps the uplink network": {
			edit: func(c *Config) { c.Network.ServiceCIDR = "10.0.0.0/12" },
			want: map[string]string{"network.serviceCIDR": "overlaps the local provider's uplink network 10.0.2.0/24"},
		},
		"service CIDR too large": {
			edit: func(c *Config) { c.Network.ServiceCIDR = "10.96.0.0/11" },
			want: map[string]string{"network.serviceCIDR": "prefix length must be 12 to 28, got 11"},
		},
		"service CIDR too small": {
			edit: func(c *Config) { c.Network.ServiceCIDR = "10.96.0.0/29" },
			want: map[string]string{"network.serviceCIDR": "prefix length must be 12 to 28, got 29"},
		},
		"service CIDR overlaps node network": {
			edit: func(c *Config) { c.Network.ServiceCIDR = "10.42.0.0/24" },
			want: map[string]string{"network.serviceCIDR": "overlaps the local provider's node network"},
		},
		"networks overlap": {
			edit: func(c *Config) { c.Network.ServiceCIDR = "10.244.0.0/24" },
			want: map[string]string{"network": "podCIDR 10.244.0.0/16 and serviceCIDR 10.244.0.0/24 overlap"},
		},
		"every problem at once": {
			edit: func(c *Config) {
				c.Version, c.Name, c.KubernetesVersion = "", "-x", "v1"
				c.Provider.Block().ControlPlanes, c.Provider.Block().Workers, c.Provider.Block().Image = 0, -1, ""
				c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Name = ""
				c.Network.PodCIDR, c.Network.ServiceCIDR = "x", "y"
			},
			want: map[string]string{
				"version": "missing", "name": "not a DNS label", "kubernetesVersion": "not supported",
				"provider.local.controlPlanes": "at least 1", "provider.local.workers": "at least 0",
				"provider.local.image": "missing", "attestation.qemuVTPM.measurements[0].name": "missing",
				"network.podCIDR": "not a CIDR", "network.serviceCIDR": "not a CIDR",
			},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			c := validConfig()
			tc.edit(c)
			err := c.Validate()
			if len(tc.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			got := problems(t, err)
			require.Len(t, got, len(tc.want), "%v", err)
			for path, msg := range tc.want {
				require.Contains(t, got, path, "%v", err)
				require.Len(t, got[path], 1, "%v", err)
				assert.Contains(t, got[path][0], msg)
				assert.Contains(t, err.Error(), path+": ", "the message names the field")
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	c := validConfig()
	c.Attestation.Of(variant.QEMUVTPM).AKRoots = testCA(t)
	// All-digit and float-looking digests must come back as strings.
	c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements[4] = measurements.Measurement{Expected: digest(0x00)}
	c.Attestation.Of(variant.QEMUVTPM).Measurements[0].Measurements[5] = measurements.Measurement{Expected: append(digest(0x00)[:29], 0x01, 0xe5, 0x00)}
	c.Attestation.Of(variant.QEMUVTPM).Measurements = append(c.Attestation.Of(variant.QEMUVTPM).Measurements, measurements.ReferenceSet{Name: "yes", Measurements: measurementstest.Image(variant.QEMUVTPM, map[uint32][]byte{11: digest(0x99)})})
	require.NoError(t, c.Validate())
	data, err := c.Marshal()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(data), "# Constellation cluster configuration (schema v1)."))
	assert.Contains(t, string(data), `expected: "`+strings.Repeat("00", 32)+`"`)
	assert.Contains(t, string(data), `expected: "`+strings.Repeat("99", 32)+`"`)
	// Fields in documentation order.
	for _, pair := range [][2]string{{"version:", "name:"}, {"name:", "kubernetesVersion:"}, {"provider:", "attestation:"}, {"attestation:", "network:"}, {`"4":`, `"11":`}} {
		assert.Less(t, strings.Index(string(data), pair[0]), strings.Index(string(data), pair[1]), "%s before %s", pair[0], pair[1])
	}
	back, err := Parse(data)
	require.NoError(t, err, "%s", data)
	assert.Equal(t, c, back)
}

func TestWriteAndLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)

	_, err := Load(path)
	require.ErrorIs(t, err, os.ErrNotExist)
	assert.ErrorContains(t, err, "config generate local")

	c := validConfig()
	require.NoError(t, Write(path, c, false))
	got, err := Load(path)
	require.NoError(t, err)
	assert.Equal(t, c, got)

	other := validConfig()
	other.Name = "other"
	require.ErrorIs(t, Write(path, other, false), os.ErrExist, "never replaced without overwrite")
	require.NoError(t, Write(path, other, true))
	got, err = Load(path)
	require.NoError(t, err)
	assert.Equal(t, "other", got.Name)

	invalid := validConfig()
	invalid.Provider.Block().ControlPlanes = 0
	err = Write(path, invalid, true)
	require.ErrorContains(t, err, "provider.local.controlPlanes: must be at least 1, got 0")

	// Load names the file and every problem.
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(validYAML, "controlPlanes: 3", "controlPlanes: 0", 1)+"bogus: 1\n"), 0o644))
	_, err = Load(path)
	require.ErrorContains(t, err, path)
	assert.ErrorContains(t, err, "bogus: unknown field")
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(validYAML, "controlPlanes: 3", "controlPlanes: 0", 1)), 0o644))
	_, err = Load(path)
	assert.ErrorContains(t, err, "provider.local.controlPlanes: must be at least 1, got 0")

	require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte("#"), MaxFileSize+1), 0o644))
	_, err = Load(path)
	assert.ErrorContains(t, err, "more than the limit")
}

func TestImagePath(t *testing.T) {
	assert.Equal(t, filepath.Join("ws", "img"), (&ProviderBlock{Image: "img"}).ImagePath("ws"))
	assert.Equal(t, "/abs/img", (&ProviderBlock{Image: "/abs/img"}).ImagePath("ws"))
	assert.Equal(t, "https://example.com/releases/v0.2.0", (&ProviderBlock{Image: "https://example.com/releases/v0.2.0"}).ImagePath("ws"), "a URL is not a path")
	assert.Equal(t, "http://127.0.0.1:8080/releases", ReleaseConfig{Source: "http://127.0.0.1:8080/releases"}.SourcePath("ws"))
}

func TestReferenceSetName(t *testing.T) {
	a := ReferenceSetName("local-", measurements.M{11: {Expected: digest(1)}})
	b := ReferenceSetName("local-", measurements.M{11: {Expected: digest(2)}})
	assert.Len(t, a, len("local-")+12)
	assert.NotEqual(t, a, b)
	assert.Equal(t, a, ReferenceSetName("local-", measurements.M{11: {Expected: digest(1)}}))
}

func testCA(t *testing.T) string {
	t.Helper()
	ca, err := akca.New("test AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	cert, _, err := ca.PEM()
	require.NoError(t, err)
	return string(cert)
}

// FuzzParse: configuration files are user input. Property: no panic; what parses and
// validates survives Marshal and Parse unchanged and still validates.
func FuzzParse(f *testing.F) {
	f.Add([]byte(validYAML))
	f.Add([]byte("version: v1\nname: a\nprovider: {local: {controlPlanes: 1, image: i}}\n"))
	f.Add([]byte("attestation: {qemuVTPM: {measurements: [{name: a, measurements: {\"15\": \"" + hexOf(0) + "\"}}], akRoots: x}}\n"))
	f.Add([]byte("network: {podCIDR: 10.244.0.0/24, serviceCIDR: 10.96.0.0/28}\n"))
	// Loose reference sets next to a good one: the register rule must refuse each.
	for _, tc := range looseSets {
		f.Add([]byte(loosePolicyYAML("loose", tc.measurements)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 8192 {
			return // larger inputs only slow the search; the size limit has its own test
		}
		c, err := Parse(data)
		if err != nil {
			return
		}
		if c.Validate() != nil {
			return
		}
		out, err := c.Marshal()
		require.NoError(t, err)
		back, err := Parse(out)
		require.NoError(t, err, "%s", out)
		require.NoError(t, back.Validate())
		require.Equal(t, c, back)
	})
}

// TestDocumentedExample keeps the example of docs/configuration.md valid.
func TestDocumentedExample(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(doc), "## constellation-conf.yaml\n\n```yaml\n")
	require.True(t, ok, "the example block")
	example, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	c, err := Parse([]byte(example))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	assert.Equal(t, "demo", c.Name)
}

// snpBlock is a valid SEV-SNP reference in YAML.
const snpBlock = `    snp:
      name: milan-2025
      products: [Milan]
      minimumTCB:
        Milan: {bootloader: 3, tee: 0, snp: 8, microcode: 115}
      vmpl: 0
      measurement: ["` + "%s" + `"]
`

func TestHardwareVariantBlocks(t *testing.T) {
	pcrs := fullSetYAML(nil)
	measurement := strings.Repeat("ab", 48)
	for name, tc := range map[string]struct {
		yaml string
		// wantParse is a fragment of the parse error; wantFields the field paths Validate reports.
		wantParse  string
		wantFields []string
	}{
		"azure sev-snp block is well formed but not the local provider's": {
			yaml:       "attestation:\n  azureSEVSNP:\n    measurements: [{name: a, measurements: " + pcrs + "}]\n" + fmt.Sprintf(snpBlock, measurement),
			wantFields: []string{"attestation.azureSEVSNP"},
		},
		"snp block with an unknown field": {
			yaml:      "attestation:\n  azureSEVSNP:\n    measurements: [{name: a, measurements: " + pcrs + "}]\n" + fmt.Sprintf(snpBlock, measurement) + "      debugAllowed: true\n",
			wantParse: "debugAllowed",
		},
		"snp block without a minimum TCB for its product": {
			yaml:       "attestation:\n  awsSEVSNP:\n    measurements: [{name: a, measurements: " + pcrs + "}]\n    snp: {name: x, products: [Genoa], measurement: [\"" + measurement + "\"]}\n",
			wantFields: []string{"attestation.awsSEVSNP", "attestation.awsSEVSNP.snp"},
		},
		"snp variant without its block": {
			yaml:       "attestation:\n  gcpSEVSNP:\n    measurements: [{name: a, measurements: " + pcrs + "}]\n",
			wantFields: []string{"attestation.gcpSEVSNP", "attestation.gcpSEVSNP.snp"},
		},
		"tdx block on the vtpm variant": {
			yaml:       "attestation:\n  qemuVTPM:\n    measurements: [{name: a, measurements: " + pcrs + "}]\n    tdx: {name: t, mrSeam: [\"" + measurement + "\"], tdAttributes: \"0000000000000000\", xfam: \"e718060000000000\", minimumTeeTcbSvn: \"00000000000000000000000000000000\"}\n",
			wantFields: []string{"attestation.qemuVTPM.tdx"},
		},
		"nitro without the opt-in": {
			yaml:       "attestation:\n  awsNitroTPM:\n    measurements: [{name: a, measurements: " + pcrs + "}]\n",
			wantFields: []string{"attestation.awsNitroTPM", "attestation.awsNitroTPM.acceptUnauthenticatedAK"},
		},
		"two variants": {
			yaml:       "attestation:\n  qemuVTPM:\n    measurements: [{name: a, measurements: " + pcrs + "}]\n  gcpSEVES:\n    measurements: [{name: a, measurements: " + pcrs + "}]\n",
			wantFields: []string{"attestation"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			doc := withAttestation(t, tc.yaml)
			c, err := Parse([]byte(doc))
			if tc.wantParse != "" {
				require.Error(t, err)
				assert.ErrorContains(t, err, tc.wantParse)
				return
			}
			require.NoError(t, err)
			got := problems(t, c.Validate())
			fields := make([]string, 0, len(got))
			for f := range got {
				fields = append(fields, f)
			}
			assert.ElementsMatch(t, tc.wantFields, fields, "%v", got)
		})
	}
}

// withAttestation replaces the attestation section of validYAML.
func withAttestation(t *testing.T, attestation string) string {
	t.Helper()
	before, after, ok := strings.Cut(validYAML, "attestation:\n")
	require.True(t, ok)
	// The attestation section runs until the next top-level key.
	rest := after
	for {
		line, tail, found := strings.Cut(rest, "\n")
		if !found || (line != "" && line[0] != ' ' && line[0] != '-') {
			break
		}
		rest = tail
	}
	return before + attestation + rest
}

// TestAttestationReference: the one configured block of a variant of the catalog is the
// reference; anything else is an error naming the block, and no variant.
func TestAttestationReference(t *testing.T) {
	vals := VariantConfig{HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: true}}
	testCases := map[string]struct {
		a       AttestationConfig
		want    variant.Variant
		wantErr string
	}{
		"one variant":  {a: AttestationFor(variant.AWSNitroTPM, vals), want: variant.AWSNitroTPM},
		"none":         {a: nil, wantErr: "attestation: 0 variants configured, want exactly one"},
		"null block":   {a: AttestationConfig{"qemuVTPM": nil}, wantErr: "attestation: 0 variants configured"},
		"two":          {a: AttestationConfig{"qemuVTPM": &vals, "qemuTDX": &vals}, wantErr: "attestation: 2 variants configured"},
		"unknown key":  {a: AttestationConfig{"sgx": &vals}, wantErr: "attestation.sgx: unknown attestation variant (known: "},
		"miscased key": {a: AttestationConfig{"awsnitrotpm": &vals}, wantErr: `attestation.awsnitrotpm: unknown attestation variant (did you mean "awsNitroTPM"?)`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ref, err := tc.a.Reference()
			assert.Equal(t, tc.want, tc.a.Variant())
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, choose.Reference{Variant: tc.want, Values: vals}, ref)
			assert.Equal(t, &vals, tc.a.Of(tc.want))
		})
	}
}

// TestAttestationKeysAreTheCatalogs: the attestation block takes exactly the configuration
// keys of the catalog's variants.
func TestAttestationKeysAreTheCatalogs(t *testing.T) {
	var want []string
	for _, v := range choose.Implemented() {
		want = append(want, v.ConfigKey())
	}
	assert.ElementsMatch(t, want, AttestationConfig{}.KnownKeys())
}
