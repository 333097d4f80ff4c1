package csidriver_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/internal/csidriver"
)

// recordingUnlocker records Stage calls and copies the key it saw (the caller clears its own).
type recordingUnlocker struct {
	err     error
	device  string
	target  string
	key     []byte
	keySeen []byte
	staged  int
}

func (u *recordingUnlocker) Stage(_ context.Context, device string, key []byte, target string) error {
	u.staged++
	u.device, u.target, u.key = device, target, key
	u.keySeen = append([]byte(nil), key...)
	return u.err
}
func (u *recordingUnlocker) Unstage(context.Context, string) error { return u.err }
func (u *recordingUnlocker) Expand(context.Context, string) error  { return u.err }
func (u *recordingUnlocker) Stats(context.Context, string) (csidriver.Stats, error) {
	return csidriver.Stats{TotalBytes: 1}, u.err
}

func TestNodeStageVolume(t *testing.T) {
	id := csidriver.IDFor("pvc-1")
	stageReq := func() *csi.NodeStageVolumeRequest {
		return &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "/staging", VolumeCapability: rwo}
	}
	testCases := map[string]struct {
		req         *csi.NodeStageVolumeRequest
		notAttached bool
		keyErr      error
		refused     bool
		unlockErr   error
		wantCode    codes.Code
		wantErr     []string
		wantStaged  bool
	}{
		"stages":      {req: stageReq(), wantStaged: true},
		"key refused": {req: stageReq(), refused: true, wantCode: codes.PermissionDenied, wantErr: []string{"no pod on this node"}},
		"key refused by the join service": {
			req: stageReq(), keyErr: status.Error(codes.PermissionDenied, "no VolumeAttachment"), wantCode: codes.PermissionDenied, wantErr: []string{"no VolumeAttachment"},
		},
		"key source unreachable": {req: stageReq(), keyErr: errors.New("dial tcp: connection refused"), wantCode: codes.Unavailable, wantErr: []string{"connection refused"}},
		"not attached here":      {req: stageReq(), notAttached: true, wantCode: codes.FailedPrecondition, wantErr: []string{"not attached"}},
		"wrong key":              {req: stageReq(), unlockErr: csidriver.ErrWrongKey, wantCode: codes.FailedPrecondition, wantErr: []string{"does not open"}, wantStaged: true},
		"unlock fails":           {req: stageReq(), unlockErr: errors.New("mkfs.ext4: exit status 1"), wantCode: codes.Internal, wantErr: []string{"mkfs.ext4"}, wantStaged: true},
		"no volume id":           {req: &csi.NodeStageVolumeRequest{StagingTargetPath: "/staging", VolumeCapability: rwo}, wantCode: codes.InvalidArgument},
		"malformed volume id":    {req: &csi.NodeStageVolumeRequest{VolumeId: "vol-../../x", StagingTargetPath: "/staging", VolumeCapability: rwo}, wantCode: codes.NotFound},
		"no staging path":        {req: &csi.NodeStageVolumeRequest{VolumeId: id, VolumeCapability: rwo}, wantCode: codes.InvalidArgument},
		"no capability":          {req: &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "/staging"}, wantCode: codes.InvalidArgument},
		"block":                  {req: &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "/staging", VolumeCapability: blockCap()}, wantCode: codes.InvalidArgument, wantErr: []string{"block"}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := newMemBacking("/volumes", "node-1")
			_, err := b.Create(ctx, id, 16*mib)
			require.NoError(t, err)
			if !tc.notAttached {
				require.NoError(t, b.Attach(ctx, id, "node-1"))
			}
			ks := &keys{err: tc.keyErr, refused: map[string]bool{id: tc.refused}}
			u := &recordingUnlocker{err: tc.unlockErr}
			n := csidriver.NewNode(csidriver.NodeConfig{NodeName: "node-1", KeySource: ks, Devices: devices{b: b, node: "node-1"}, Unlocker: u})

			_, err = n.NodeStageVolume(ctx, tc.req)
			assertCode(t, tc.wantCode, err, tc.wantErr...)
			assert.Equal(t, tc.wantStaged, u.staged > 0, "a refused key or a missing device never reaches the unlocker (nothing is formatted)")
			if u.staged > 0 {
				assert.Equal(t, "/volumes/"+id+".img", u.device)
				assert.Equal(t, "/staging", u.target)
				assert.Len(t, u.keySeen, 32)
				assert.Equal(t, make([]byte, 32), u.key, "the key is cleared after use")
			}
			for _, k := range ks.handed {
				assert.Equal(t, make([]byte, 32), k, "every handed-out key is cleared")
			}
		})
	}
}

func TestNodeRequestsWithoutMounts(t *testing.T) {
	ctx := context.Background()
	id := csidriver.IDFor("pvc-1")
	dir := t.TempDir()
	n := csidriver.NewNode(csidriver.NodeConfig{NodeName: "node-1", Unlocker: &recordingUnlocker{}})
	notStaged := filepath.Join(dir, "staging")
	require.NoError(t, os.Mkdir(notStaged, 0o700))
	emptyTarget := filepath.Join(dir, "target")
	require.NoError(t, os.Mkdir(emptyTarget, 0o700))

	testCases := map[string]struct {
		call     func() error
		wantCode codes.Code
	}{
		"publish: not staged": {call: func() error {
			_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(dir, "t"), StagingTargetPath: notStaged, VolumeCapability: rwo})
			return err
		}, wantCode: codes.FailedPrecondition},
		"publish: no target": {call: func() error {
			_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: notStaged, VolumeCapability: rwo})
			return err
		}, wantCode: codes.InvalidArgument},
		"publish: no staging path": {call: func() error {
			_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: emptyTarget, VolumeCapability: rwo})
			return err
		}, wantCode: codes.InvalidArgument},
		"publish: no capability": {call: func() error {
			_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: emptyTarget, StagingTargetPath: notStaged})
			return err
		}, wantCode: codes.InvalidArgument},
		"unpublish: gone already": {call: func() error {
			_, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(dir, "never")})
			return err
		}},
		"unpublish: no target": {call: func() error {
			_, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id})
			return err
		}, wantCode: codes.InvalidArgument},
		"unstage: no path": {call: func() error {
			_, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id})
			return err
		}, wantCode: codes.InvalidArgument},
		"unstage: no id": {call: func() error {
			_, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{StagingTargetPath: notStaged})
			return err
		}, wantCode: codes.InvalidArgument},
		"stats: not mounted": {call: func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: notStaged})
			return err
		}, wantCode: codes.NotFound},
		"stats: no such path": {call: func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: "some/path"})
			return err
		}, wantCode: codes.NotFound},
		"stats: no path": {call: func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id})
			return err
		}, wantCode: codes.InvalidArgument},
		"stats: no id": {call: func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumePath: notStaged})
			return err
		}, wantCode: codes.InvalidArgument},
		"expand: not mounted": {call: func() error {
			_, err := n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: "some/path"})
			return err
		}, wantCode: codes.NotFound},
		"expand: no path": {call: func() error {
			_, err := n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id})
			return err
		}, wantCode: codes.InvalidArgument},
		"expand: no id": {call: func() error {
			_, err := n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumePath: notStaged})
			return err
		}, wantCode: codes.InvalidArgument},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			assertCode(t, tc.wantCode, tc.call())
		})
	}

	// An unmounted target directory is removed; the staging directory is not touched.
	_, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: emptyTarget})
	require.NoError(t, err)
	assert.NoDirExists(t, emptyTarget)
	assert.DirExists(t, notStaged)

	info, err := n.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, "node-1", info.GetNodeId())
	assert.Zero(t, info.GetMaxVolumesPerNode())
	caps, err := n.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	require.NoError(t, err)
	var got []string
	for _, c := range caps.GetCapabilities() {
		got = append(got, c.GetRpc().GetType().String())
	}
	assert.ElementsMatch(t, []string{"STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME", "GET_VOLUME_STATS"}, got)
}
