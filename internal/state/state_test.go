package state

import (
	"bytes"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/strictyaml"
)

var (
	created     = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	initialized = created.Add(3 * time.Minute)
)

func createdState() *State {
	return &State{
		Version: "v1", Name: "demo", Provider: "local", Phase: Created, CreatedAt: created,
		InitEndpoint: "10.42.0.10:9000", APIServerEndpoint: "127.0.0.1:36443",
		Nodes: []Node{
			{Name: "demo-control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}},
			{Name: "demo-worker-0", Role: metadata.Worker, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.11")}},
		},
	}
}

func initializedState() *State {
	s := createdState()
	s.Phase, s.InitializedAt = Initialized, initialized
	// All digits in hex: must be quoted when written.
	s.ClusterID = bytes.Repeat([]byte{0x12}, 32)
	s.MeasurementSalt = bytes.Repeat([]byte{0xab}, 32)
	return s
}

const initializedYAML = `version: v1
name: demo
provider: local
phase: initialized
createdAt: 2026-01-02T03:04:05Z
initializedAt: "2026-01-02T03:07:05Z"
initEndpoint: 10.42.0.10:9000
apiServerEndpoint: 127.0.0.1:36443
nodes:
- name: demo-control-plane-0
  role: control-plane
  ips: [10.42.0.10]
- name: demo-worker-0
  role: worker
  ips: ["10.42.0.11"]
clusterID: "1212121212121212121212121212121212121212121212121212121212121212"
measurementSalt: abababababababababababababababababababababababababababababababab
`

func TestParse(t *testing.T) {
	s, err := Parse([]byte(initializedYAML))
	require.NoError(t, err)
	assert.Equal(t, initializedState(), s)
	require.NoError(t, s.Validate())
}

func TestRoundTrip(t *testing.T) {
	for name, s := range map[string]*State{"created": createdState(), "initialized": initializedState()} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			require.NoError(t, Write(path, s))
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.True(t, strings.HasPrefix(string(data), "# Constellation cluster state (schema v1)"))
			if s.Phase == Initialized {
				assert.Contains(t, string(data), `clusterID: "`+strings.Repeat("12", 32)+`"`, "all-digit hex is quoted")
			} else {
				assert.NotContains(t, string(data), "clusterID")
				assert.NotContains(t, string(data), "initializedAt")
			}
			got, err := Load(path)
			require.NoError(t, err)
			assert.Equal(t, s, got)

			// Writing again replaces atomically.
			require.NoError(t, Write(path, initializedState()))
			got, err = Load(path)
			require.NoError(t, err)
			assert.Equal(t, Initialized, got.Phase)
		})
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	_, err := Load(path)
	require.ErrorIs(t, err, ErrNoState)
	require.ErrorIs(t, err, os.ErrNotExist)
	assert.ErrorContains(t, err, "no cluster was created in this workspace")

	testCases := map[string]struct {
		data    string
		wantErr []string
	}{
		"empty":                      {data: "", wantErr: []string{"is malformed", "the document is empty"}},
		"not YAML":                   {data: "nodes: [\n", wantErr: []string{"is malformed", "invalid YAML"}},
		"unknown field":              {data: initializedYAML + "secret: x\n", wantErr: []string{"is malformed", "secret: unknown field"}},
		"miscased field":             {data: strings.Replace(initializedYAML, "clusterID:", "clusterId:", 1), wantErr: []string{`clusterId: unknown field (did you mean "clusterID"?)`}},
		"unknown in node":            {data: strings.Replace(initializedYAML, "  role: worker\n", "  role: worker\n  zone: a\n", 1), wantErr: []string{"nodes[1].zone: unknown field"}},
		"cluster ID digits unquoted": {data: strings.Replace(initializedYAML, `"`+strings.Repeat("12", 32)+`"`, strings.Repeat("12", 32), 1), wantErr: []string{"clusterID: must be a string, got the number", "quote the value"}},
		"cluster ID not hex":         {data: strings.Replace(initializedYAML, `"`+strings.Repeat("12", 32)+`"`, "xyz", 1), wantErr: []string{"clusterID: not hex"}},
		"bad IP":                     {data: strings.Replace(initializedYAML, "[10.42.0.10]", "[10.42.0.300]", 1), wantErr: []string{"nodes[0].ips[0]:"}},
		"bad time":                   {data: strings.Replace(initializedYAML, "createdAt: 2026-01-02T03:04:05Z", "createdAt: yesterday", 1), wantErr: []string{"createdAt:"}},
		"duplicate key":              {data: initializedYAML + "phase: created\n", wantErr: []string{"is malformed", `"phase" already set`}},
		"invalid":                    {data: strings.Replace(initializedYAML, "phase: initialized", "phase: created", 1), wantErr: []string{"is invalid", "clusterID: set, but the cluster is not initialized"}},
		"too large":                  {data: initializedYAML + "#" + strings.Repeat("x", MaxFileSize), wantErr: []string{"more than the limit"}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, []byte(tc.data), 0o644))
			_, err := Load(path)
			require.Error(t, err)
			assert.ErrorContains(t, err, path, "names the file")
			for _, want := range tc.wantErr {
				assert.ErrorContains(t, err, want)
			}
		})
	}
}

// TestValidate: each invalid field gives its own error, named by its path.
func TestValidate(t *testing.T) {
	testCases := map[string]struct {
		base func() *State
		edit func(*State)
		want map[string]string
	}{
		"valid created":              {base: createdState, edit: func(*State) {}},
		"valid initialized":          {base: initializedState, edit: func(*State) {}},
		"valid without API endpoint": {base: createdState, edit: func(s *State) { s.APIServerEndpoint = "" }},
		"valid with DNS endpoint":    {base: createdState, edit: func(s *State) { s.InitEndpoint = "node-0.example.com:9000" }},
		"valid IPv6 endpoint":        {base: createdState, edit: func(s *State) { s.InitEndpoint = "[fd00::1]:9000" }},
		"version":                    {base: createdState, edit: func(s *State) { s.Version = "v0" }, want: map[string]string{"version": `"v0" is not supported`}},
		"version missing":            {base: createdState, edit: func(s *State) { s.Version = "" }, want: map[string]string{"version": "missing"}},
		"name missing":               {base: createdState, edit: func(s *State) { s.Name = "" }, want: map[string]string{"name": "missing"}},
		"name not a label":           {base: createdState, edit: func(s *State) { s.Name = "De mo" }, want: map[string]string{"name": "not a DNS label"}},
		"provider":                   {base: createdState, edit: func(s *State) { s.Provider = "gcp" }, want: map[string]string{"provider": `"gcp" is not a provider (known: local)`}},
		"createdAt":                  {base: createdState, edit: func(s *State) { s.CreatedAt = time.Time{} }, want: map[string]string{"createdAt": "missing"}},
		"init endpoint missing":      {base: createdState, edit: func(s *State) { s.InitEndpoint = "" }, want: map[string]string{"initEndpoint": "missing"}},
		"init endpoint no port":      {base: createdState, edit: func(s *State) { s.InitEndpoint = "10.42.0.10" }, want: map[string]string{"initEndpoint": "not host:port"}},
		"init endpoint bad port":     {base: createdState, edit: func(s *State) { s.InitEndpoint = "10.42.0.10:0" }, want: map[string]string{"initEndpoint": "not a number from 1 to 65535"}},
		"init endpoint no host":      {base: createdState, edit: func(s *State) { s.InitEndpoint = ":9000" }, want: map[string]string{"initEndpoint": "has no host"}},
		"init endpoint bad host":     {base: createdState, edit: func(s *State) { s.InitEndpoint = "a_b:9000" }, want: map[string]string{"initEndpoint": "neither an IP address nor a DNS name"}},
		"API endpoint":               {base: createdState, edit: func(s *State) { s.APIServerEndpoint = "x:99999" }, want: map[string]string{"apiServerEndpoint": "port"}},
		"no nodes":                   {base: createdState, edit: func(s *State) { s.Nodes = nil }, want: map[string]string{"nodes": "no nodes"}},
		"no control plane":           {base: createdState, edit: func(s *State) { s.Nodes = s.Nodes[1:] }, want: map[string]string{"nodes": "no control-plane node"}},
		"node name missing":          {base: createdState, edit: func(s *State) { s.Nodes[1].Name = "" }, want: map[string]string{"nodes[1].name": "missing"}},
		"node name invalid":          {base: createdState, edit: func(s *State) { s.Nodes[1].Name = "Worker_0" }, want: map[string]string{"nodes[1].name": "not a DNS name"}},
		"node name twice":            {base: createdState, edit: func(s *State) { s.Nodes[1].Name = s.Nodes[0].Name }, want: map[string]string{"nodes[1].name": "also the name of nodes[0]"}},
		"node role":                  {base: createdState, edit: func(s *State) { s.Nodes[1].Role = "master" }, want: map[string]string{"nodes[1].role": `"master" is not a role`}},
		"node without IP":            {base: createdState, edit: func(s *State) { s.Nodes[1].IPs = nil }, want: map[string]string{"nodes[1].ips": "no IP address"}},
		"node unspecified IP":        {base: createdState, edit: func(s *State) { s.Nodes[1].IPs = []netip.Addr{netip.IPv4Unspecified()} }, want: map[string]string{"nodes[1].ips[0]": "unusable address"}},
		"node IP shared":             {base: createdState, edit: func(s *State) { s.Nodes[1].IPs = s.Nodes[0].IPs }, want: map[string]string{"nodes[1].ips[0]": "also an address of demo-control-plane-0"}},
		"phase missing":              {base: createdState, edit: func(s *State) { s.Phase = "" }, want: map[string]string{"phase": "missing"}},
		"phase unknown":              {base: createdState, edit: func(s *State) { s.Phase = "running" }, want: map[string]string{"phase": `"running" is not a phase`}},
		"created with cluster ID": {
			base: initializedState, edit: func(s *State) { s.Phase = Created },
			want: map[string]string{"initializedAt": "set, but", "clusterID": "set, but", "measurementSalt": "set, but"},
		},
		"initialized without details": {
			base: createdState, edit: func(s *State) { s.Phase = Initialized },
			want: map[string]string{"initializedAt": "missing", "clusterID": "has 0 bytes, want 32", "measurementSalt": "has 0 bytes, want 32"},
		},
		"initialized before created": {
			base: initializedState, edit: func(s *State) { s.InitializedAt = created.Add(-time.Second) },
			want: map[string]string{"initializedAt": "before createdAt"},
		},
		"short cluster ID": {base: initializedState, edit: func(s *State) { s.ClusterID = s.ClusterID[:31] }, want: map[string]string{"clusterID": "has 31 bytes"}},
		"valid disks":      {base: initializedState, edit: func(s *State) { s.Nodes[0].Disk, s.Nodes[1].Disk = diskA, diskB }},
		"disk not lower case": {
			base: initializedState, edit: func(s *State) { s.Nodes[0].Disk = strings.ToUpper(diskA) },
			want: map[string]string{"nodes[0].disk": "not a lower-case UUID"},
		},
		"disk not a UUID": {base: initializedState, edit: func(s *State) { s.Nodes[0].Disk = "../../x" }, want: map[string]string{"nodes[0].disk": "not a lower-case UUID"}},
		"disk of two nodes": {
			base: initializedState, edit: func(s *State) { s.Nodes[0].Disk, s.Nodes[1].Disk = diskA, diskA },
			want: map[string]string{"nodes[1].disk": "also the disk of nodes[0]"},
		},
		"disk before init": {base: createdState, edit: func(s *State) { s.Nodes[0].Disk = diskA }, want: map[string]string{"nodes[0].disk": "set, but the cluster is not initialized"}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			s := tc.base()
			tc.edit(s)
			err := s.Validate()
			if len(tc.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			fes := strictyaml.FieldErrors(err)
			got := map[string]string{}
			for _, fe := range fes {
				require.NotContains(t, got, fe.Path, "one problem per field: %v", err)
				got[fe.Path] = fe.Err.Error()
			}
			require.Len(t, got, len(tc.want), "%v", err)
			for path, msg := range tc.want {
				require.Contains(t, got, path, "%v", err)
				assert.Contains(t, got[path], msg)
			}
			assert.ErrorContains(t, Write(filepath.Join(t.TempDir(), FileName), s), "refusing to write an invalid cluster state")
		})
	}
}

func TestClusterIDMarker(t *testing.T) {
	s := initializedState()
	got, err := s.ClusterIDMarker(variant.QEMUVTPM)
	require.NoError(t, err)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(s.ClusterID), got)
	_, err = createdState().ClusterIDMarker(variant.QEMUVTPM)
	assert.ErrorContains(t, err, "not initialized")
}

func TestControlPlanes(t *testing.T) {
	s := createdState()
	assert.Equal(t, []Node{s.Nodes[0]}, s.ControlPlanes())
}

// FuzzParse: a state file may be edited or corrupted. Property: no panic; what parses and
// validates survives Marshal and Parse and still validates.
func FuzzParse(f *testing.F) {
	f.Add([]byte(initializedYAML))
	f.Add([]byte("version: v1\nname: a\nprovider: local\nphase: created\ncreatedAt: 2026-01-01T00:00:00Z\ninitEndpoint: a:1\nnodes: [{name: a, role: control-plane, ips: [\"::1\"]}]\n"))
	f.Add([]byte("clusterID: 00\nmeasurementSalt: \"\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 8192 {
			return
		}
		s, err := Parse(data)
		if err != nil || s.Validate() != nil {
			return
		}
		out, err := s.Marshal()
		require.NoError(t, err)
		back, err := Parse(out)
		require.NoError(t, err, "%s", out)
		require.NoError(t, back.Validate())
		again, err := back.Marshal()
		require.NoError(t, err)
		require.Equal(t, string(out), string(again))
	})
}

func TestRemovedNodes(t *testing.T) {
	base := func() *State {
		return &State{
			Version: Version1, Name: "demo", Provider: ProviderLocal, Phase: Created, CreatedAt: time.Now(),
			InitEndpoint: "10.42.0.10:9000",
			Nodes:        []Node{{Name: "control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}}},
		}
	}
	testCases := map[string]struct {
		removed []RemovedNode
		wantErr []string
	}{
		"none": {},
		"one":  {removed: []RemovedNode{{Name: "worker-1", Role: metadata.Worker, RemovedAt: time.Now()}}},
		"name reused": {
			removed: []RemovedNode{{Name: "control-plane-0", Role: metadata.ControlPlane, RemovedAt: time.Now()}},
			wantErr: []string{"removed[0].name", "never reused"},
		},
		"malformed": {
			removed: []RemovedNode{{Name: "Worker_1", Role: "boss"}},
			wantErr: []string{"removed[0].name", "removed[0].role", "removed[0].removedAt"},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			s := base()
			s.Removed = tc.removed
			err := s.Validate()
			if len(tc.wantErr) == 0 {
				require.NoError(t, err)
				data, err := s.Marshal()
				require.NoError(t, err)
				back, err := Parse(data)
				require.NoError(t, err)
				assert.Equal(t, len(tc.removed), len(back.Removed), "round trip")
				return
			}
			require.Error(t, err)
			for _, w := range tc.wantErr {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}
