package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/metadata"
)

const (
	diskA = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
	diskB = "0d9e4a2c-5b1f-4c3e-8a7d-6f2e1b0c9a88"
	diskC = "c0ffee00-0000-4000-8000-000000000003"
)

// RecordDisks copies the cluster's records, and never silently replaces a recorded disk.
func TestRecordDisks(t *testing.T) {
	const cp, w = "demo-control-plane-0", "demo-worker-0"
	testCases := map[string]struct {
		have     map[string]string // node → disk recorded before
		records  []DiskOwner
		want     map[string]string // node → disk after
		recorded int
		replaced []string // substrings of Replaced, in order
		problems []string // substrings of Problems, in order
	}{
		"first records": {
			records:  []DiskOwner{{diskA, cp}, {diskB, w}},
			want:     map[string]string{cp: diskA, w: diskB},
			recorded: 2,
		},
		"same again changes nothing": {
			have: map[string]string{cp: diskA, w: diskB}, records: []DiskOwner{{diskA, cp}, {diskB, w}},
			want: map[string]string{cp: diskA, w: diskB},
		},
		"removed nodes' records are ignored": {
			have: map[string]string{cp: diskA}, records: []DiskOwner{{diskA, cp}, {diskC, "demo-worker-1"}},
			want: map[string]string{cp: diskA},
		},
		"a control plane that has not joined": {
			records: []DiskOwner{{diskB, w}}, want: map[string]string{w: diskB}, recorded: 1,
			problems: []string{cp + ": the cluster records no disk for this control plane"},
		},
		"two disks for a node without a record: none taken": {
			records:  []DiskOwner{{diskA, cp}, {diskC, cp}, {diskB, w}},
			want:     map[string]string{w: diskB},
			recorded: 1,
			problems: []string{cp + ": the cluster records 2 disks for this node (" + diskA + ", " + diskC + ")"},
		},
		"a second disk for a recorded node: kept": {
			have: map[string]string{cp: diskA}, records: []DiskOwner{{diskA, cp}, {diskC, cp}},
			want:     map[string]string{cp: diskA},
			problems: []string{cp + ": the cluster records other disks for this node too (" + diskA + ", " + diskC + "); kept " + diskA + ": recover sends it only that disk's key; if its disk was replaced on purpose, delete the record of " + diskA},
		},
		"the recorded disk now recorded for another node: kept": {
			have: map[string]string{cp: diskA}, records: []DiskOwner{{diskA, w}},
			want:     map[string]string{cp: diskA},
			problems: []string{cp + ": the cluster records disk " + diskA + ", this node's here, as " + w + "'s: kept", w + ": the cluster records disk " + diskA + " as this node's, but this file records it as " + cp + "'s"},
		},
		"old record deleted, no new one: kept": {
			have: map[string]string{cp: diskA}, records: nil,
			want:     map[string]string{cp: diskA},
			problems: []string{"no longer records disk " + diskA + " for this node, nor any other: kept"},
		},
		"old record deleted by an administrator, one new disk: replaced, loudly": {
			have: map[string]string{cp: diskA}, records: []DiskOwner{{diskC, cp}},
			want:     map[string]string{cp: diskC},
			replaced: []string{cp + ": disk changed from " + diskA + " to " + diskC},
		},
		"old record deleted, the new disk is another node's here: kept": {
			have: map[string]string{cp: diskA, w: diskB}, records: []DiskOwner{{diskB, cp}},
			want: map[string]string{cp: diskA, w: diskB},
			problems: []string{
				cp + ": the cluster records disk " + diskB + " for this node, which this file records as " + w + "'s: kept " + diskA,
				w + ": the cluster records disk " + diskB + ", this node's here, as " + cp + "'s: kept",
			},
		},
		"old record deleted, two new disks: kept": {
			have: map[string]string{cp: diskA}, records: []DiskOwner{{diskB, cp}, {diskC, cp}},
			want:     map[string]string{cp: diskA},
			problems: []string{"no longer records disk " + diskA + " and records 2 others"},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			s := initializedState()
			for i, n := range s.Nodes {
				s.Nodes[i].Disk = tc.have[n.Name]
			}
			r := s.RecordDisks(tc.records)
			got := map[string]string{}
			for _, n := range s.Nodes {
				if n.Disk != "" {
					got[n.Name] = n.Disk
				}
			}
			assert.Equal(t, tc.want, got)
			assert.Len(t, r.Recorded, tc.recorded)
			require.Len(t, r.Replaced, len(tc.replaced), "%q", r.Replaced)
			for i, want := range tc.replaced {
				assert.Contains(t, r.Replaced[i], want)
			}
			require.Len(t, r.Problems, len(tc.problems), "%q", r.Problems)
			for i, want := range tc.problems {
				assert.Contains(t, r.Problems[i], want)
			}
			assert.Equal(t, tc.recorded > 0 || len(tc.replaced) > 0, r.Changed())
			require.NoError(t, s.Validate(), "the result is always a valid state")
		})
	}
}

// The disks survive the state file, and a later refresh that disagrees leaves the file's
// record as it was.
func TestDisksRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := initializedState()
	r := s.RecordDisks([]DiskOwner{{diskA, "demo-control-plane-0"}, {diskB, "demo-worker-0"}})
	require.True(t, r.Changed())
	require.NoError(t, Write(path, s))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(data), "  disk: "+diskA+"\n")

	loaded, err := Load(path)
	require.NoError(t, err)
	assert.Equal(t, s, loaded)
	assert.Equal(t, metadata.ControlPlane, loaded.Nodes[0].Role)
	n, ok := loaded.NodeByDisk(diskB)
	require.True(t, ok)
	assert.Equal(t, "demo-worker-0", n.Name)
	_, ok = loaded.NodeByDisk(diskC)
	assert.False(t, ok)

	// The control plane now names another disk in the cluster (its old record still there).
	r = loaded.RecordDisks([]DiskOwner{{diskA, "demo-control-plane-0"}, {diskC, "demo-control-plane-0"}, {diskB, "demo-worker-0"}})
	assert.False(t, r.Changed(), "nothing to write")
	assert.Equal(t, diskA, loaded.Nodes[0].Disk)
	require.NotEmpty(t, r.Problems)

	// A hand-edited file is read as strictly as the rest.
	edited := strings.Replace(string(data), "disk: "+diskA, "disk: "+strings.ToUpper(diskA), 1)
	require.NoError(t, os.WriteFile(path, []byte(edited), 0o644))
	_, err = Load(path)
	assert.ErrorContains(t, err, "nodes[0].disk")
	edited = strings.Replace(string(data), "disk: "+diskA, "disks: "+diskA, 1)
	require.NoError(t, os.WriteFile(path, []byte(edited), 0o644))
	_, err = Load(path)
	assert.ErrorContains(t, err, "nodes[0].disks: unknown field")
}
