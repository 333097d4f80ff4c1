package csidriver_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/internal/csidriver"
)

const mib = int64(1) << 20

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

var rwo = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func assertCode(t *testing.T, want codes.Code, err error, contains ...string) {
	t.Helper()
	if want == codes.OK {
		assert.NoError(t, err)
		return
	}
	require.Error(t, err)
	assert.Equal(t, want, status.Code(err), err.Error())
	for _, c := range contains {
		assert.Contains(t, err.Error(), c)
	}
}

func newController(b *memBacking) *csidriver.Controller {
	return csidriver.NewController(b, slog.New(slog.DiscardHandler))
}

func TestCreateVolume(t *testing.T) {
	testCases := map[string]struct {
		req       *csi.CreateVolumeRequest
		existing  int64 // bytes of a volume of that name made before
		wantCode  codes.Code
		wantBytes int64
		wantErr   []string
	}{
		"default size":           {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}}, wantBytes: 1 << 30},
		"rounded up to MiB":      {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 100*mib + 1}}, wantBytes: 101 * mib},
		"exact MiB":              {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 100 * mib, LimitBytes: 100 * mib}}, wantBytes: 100 * mib},
		"small gets the minimum": {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 1}}, wantBytes: csidriver.MinBytes},
		"only a limit":           {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{LimitBytes: 200*mib + 5}}, wantBytes: 200 * mib},
		"limit below required":   {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 10 * mib, LimitBytes: 5 * mib}}, wantCode: codes.InvalidArgument, wantErr: []string{"limit"}},
		"rounding past limit":    {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 20*mib + 1, LimitBytes: 20*mib + 2}}, wantCode: codes.OutOfRange},
		"limit below minimum":    {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{LimitBytes: mib}}, wantCode: codes.OutOfRange},
		"negative":               {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: -1}}, wantCode: codes.InvalidArgument},
		"huge":                   {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 1<<63 - 1}}, wantCode: codes.OutOfRange},
		"no name":                {req: &csi.CreateVolumeRequest{VolumeCapabilities: []*csi.VolumeCapability{rwo}}, wantCode: codes.InvalidArgument, wantErr: []string{"name"}},
		"no capabilities":        {req: &csi.CreateVolumeRequest{Name: "pvc-1"}, wantCode: codes.InvalidArgument, wantErr: []string{"capabilities"}},
		"block":                  {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{blockCap()}}, wantCode: codes.InvalidArgument, wantErr: []string{"block"}},
		"multi node":             {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}}, wantCode: codes.InvalidArgument, wantErr: []string{"MULTI_NODE_MULTI_WRITER"}},
		"single writer":          {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)}}, wantBytes: 1 << 30},
		"reader only":            {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)}}, wantBytes: 1 << 30},
		"unknown parameter":      {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{"replicas": "3"}}, wantCode: codes.InvalidArgument, wantErr: []string{"replicas"}},
		"sidecar parameter":      {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{"csi.storage.k8s.io/pvc/name": "data"}}, wantBytes: 1 << 30},
		"from a snapshot":        {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}, VolumeContentSource: &csi.VolumeContentSource{}}, wantCode: codes.InvalidArgument},
		"same again":             {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}}, existing: 1 << 30, wantBytes: 1 << 30},
		"other size exists":      {req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}}, existing: 2 << 30, wantCode: codes.AlreadyExists},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			b := newMemBacking("", "node-1")
			if tc.existing > 0 {
				_, err := b.Create(context.Background(), csidriver.IDFor(tc.req.Name), tc.existing)
				require.NoError(t, err)
			}
			resp, err := newController(b).CreateVolume(context.Background(), tc.req)
			assertCode(t, tc.wantCode, err, tc.wantErr...)
			if tc.wantCode != codes.OK {
				return
			}
			assert.Equal(t, csidriver.IDFor(tc.req.Name), resp.GetVolume().GetVolumeId())
			assert.Equal(t, tc.wantBytes, resp.GetVolume().GetCapacityBytes())
			vol, err := b.Get(context.Background(), resp.GetVolume().GetVolumeId())
			require.NoError(t, err)
			assert.Equal(t, tc.wantBytes, vol.Bytes)
		})
	}
}

func TestControllerPublishVolume(t *testing.T) {
	id := csidriver.IDFor("pvc-1")
	testCases := map[string]struct {
		req        *csi.ControllerPublishVolumeRequest
		attachedTo string
		backingErr error
		wantCode   codes.Code
		wantErr    []string
	}{
		"attaches":            {req: &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: rwo}},
		"attached here":       {req: &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: rwo}, attachedTo: "node-1"},
		"attached elsewhere":  {req: &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: rwo}, attachedTo: "node-2", wantCode: codes.FailedPrecondition, wantErr: []string{"node-2"}},
		"unknown volume":      {req: &csi.ControllerPublishVolumeRequest{VolumeId: csidriver.IDFor("other"), NodeId: "node-1", VolumeCapability: rwo}, wantCode: codes.NotFound},
		"malformed volume id": {req: &csi.ControllerPublishVolumeRequest{VolumeId: "../../etc", NodeId: "node-1", VolumeCapability: rwo}, wantCode: codes.NotFound},
		"unknown node":        {req: &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-9", VolumeCapability: rwo}, wantCode: codes.NotFound, wantErr: []string{"node-9"}},
		"no volume id":        {req: &csi.ControllerPublishVolumeRequest{NodeId: "node-1", VolumeCapability: rwo}, wantCode: codes.InvalidArgument},
		"no node id":          {req: &csi.ControllerPublishVolumeRequest{VolumeId: id, VolumeCapability: rwo}, wantCode: codes.InvalidArgument},
		"no capability":       {req: &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1"}, wantCode: codes.InvalidArgument},
		"block":               {req: &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: blockCap()}, wantCode: codes.InvalidArgument, wantErr: []string{"block"}},
		"platform fails":      {req: &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: rwo}, backingErr: errors.New("metadata service down"), wantCode: codes.Internal, wantErr: []string{"metadata service down"}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := newMemBacking("", "node-1", "node-2")
			_, err := b.Create(ctx, id, 16*mib)
			require.NoError(t, err)
			if tc.attachedTo != "" {
				require.NoError(t, b.Attach(ctx, id, tc.attachedTo))
			}
			b.err = tc.backingErr
			_, err = newController(b).ControllerPublishVolume(ctx, tc.req)
			assertCode(t, tc.wantCode, err, tc.wantErr...)
			if tc.wantCode == codes.OK {
				b.err = nil
				vol, err := b.Get(ctx, id)
				require.NoError(t, err)
				assert.Equal(t, "node-1", vol.AttachedTo)
			}
		})
	}
}

func TestControllerUnpublishAndDelete(t *testing.T) {
	ctx := context.Background()
	id := csidriver.IDFor("pvc-1")
	b := newMemBacking("", "node-1")
	c := newController(b)
	_, err := b.Create(ctx, id, 16*mib)
	require.NoError(t, err)
	require.NoError(t, b.Attach(ctx, id, "node-1"))

	_, err = c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	assertCode(t, codes.FailedPrecondition, err, "attached")

	for name, req := range map[string]*csi.ControllerUnpublishVolumeRequest{
		"other node":     {VolumeId: id, NodeId: "node-2"},
		"unknown volume": {VolumeId: csidriver.IDFor("other"), NodeId: "node-1"},
		"malformed id":   {VolumeId: "nope", NodeId: "node-1"},
	} {
		_, err = c.ControllerUnpublishVolume(ctx, req)
		assert.NoError(t, err, name)
	}
	vol, err := b.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "node-1", vol.AttachedTo, "detaching from another node leaves the attachment")

	_, err = c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{})
	assertCode(t, codes.InvalidArgument, err)
	// No node: detach from whichever node holds it.
	_, err = c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id})
	require.NoError(t, err)
	vol, err = b.Get(ctx, id)
	require.NoError(t, err)
	assert.Empty(t, vol.AttachedTo)

	_, err = c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	require.NoError(t, err)
	_, err = b.Get(ctx, id)
	assert.ErrorIs(t, err, csidriver.ErrNotFound)
	// Deleted already, or never could exist: done.
	_, err = c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	assert.NoError(t, err)
	_, err = c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "not-ours"})
	assert.NoError(t, err)
	_, err = c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{})
	assertCode(t, codes.InvalidArgument, err)
}

func TestValidateVolumeCapabilities(t *testing.T) {
	id := csidriver.IDFor("pvc-1")
	testCases := map[string]struct {
		req           *csi.ValidateVolumeCapabilitiesRequest
		wantCode      codes.Code
		wantConfirmed bool
	}{
		"supported":       {req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{rwo}}, wantConfirmed: true},
		"block":           {req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{blockCap()}}},
		"multi node":      {req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)}}},
		"no capabilities": {req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id}, wantCode: codes.InvalidArgument},
		"no id":           {req: &csi.ValidateVolumeCapabilitiesRequest{VolumeCapabilities: []*csi.VolumeCapability{rwo}}, wantCode: codes.InvalidArgument},
		"unknown":         {req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: csidriver.IDFor("x"), VolumeCapabilities: []*csi.VolumeCapability{rwo}}, wantCode: codes.NotFound},
		"malformed":       {req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo}}, wantCode: codes.NotFound},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			b := newMemBacking("", "node-1")
			_, err := b.Create(context.Background(), id, 16*mib)
			require.NoError(t, err)
			resp, err := newController(b).ValidateVolumeCapabilities(context.Background(), tc.req)
			assertCode(t, tc.wantCode, err)
			if tc.wantCode == codes.OK {
				assert.Equal(t, tc.wantConfirmed, resp.GetConfirmed() != nil, resp.GetMessage())
				if !tc.wantConfirmed {
					assert.NotEmpty(t, resp.GetMessage())
				}
			}
		})
	}
}

func TestControllerExpandVolume(t *testing.T) {
	id := csidriver.IDFor("pvc-1")
	testCases := map[string]struct {
		req       *csi.ControllerExpandVolumeRequest
		wantCode  codes.Code
		wantBytes int64
	}{
		"grows":        {req: &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 64*mib - 3}}, wantBytes: 64 * mib},
		"same size":    {req: &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mib}}, wantBytes: 32 * mib},
		"no range":     {req: &csi.ControllerExpandVolumeRequest{VolumeId: id}, wantCode: codes.InvalidArgument},
		"no id":        {req: &csi.ControllerExpandVolumeRequest{CapacityRange: &csi.CapacityRange{RequiredBytes: mib}}, wantCode: codes.InvalidArgument},
		"unknown":      {req: &csi.ControllerExpandVolumeRequest{VolumeId: csidriver.IDFor("x"), CapacityRange: &csi.CapacityRange{RequiredBytes: mib}}, wantCode: codes.NotFound},
		"malformed":    {req: &csi.ControllerExpandVolumeRequest{VolumeId: "vol-XYZ", CapacityRange: &csi.CapacityRange{RequiredBytes: mib}}, wantCode: codes.NotFound},
		"bad range":    {req: &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib, LimitBytes: mib}}, wantCode: codes.InvalidArgument},
		"block volume": {req: &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}, VolumeCapability: blockCap()}, wantCode: codes.InvalidArgument},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			b := newMemBacking("", "node-1")
			_, err := b.Create(context.Background(), id, 32*mib)
			require.NoError(t, err)
			resp, err := newController(b).ControllerExpandVolume(context.Background(), tc.req)
			assertCode(t, tc.wantCode, err)
			if tc.wantCode == codes.OK {
				assert.Equal(t, tc.wantBytes, resp.GetCapacityBytes())
				assert.True(t, resp.GetNodeExpansionRequired())
			}
		})
	}
}

func TestCapabilities(t *testing.T) {
	ctx := context.Background()
	cc, err := newController(newMemBacking("")).ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	require.NoError(t, err)
	var got []string
	for _, c := range cc.GetCapabilities() {
		got = append(got, c.GetRpc().GetType().String())
	}
	assert.ElementsMatch(t, []string{"CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME", "EXPAND_VOLUME"}, got)

	info, err := csidriver.Identity{}.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, csidriver.Name, info.GetName())
	assert.NotEmpty(t, info.GetVendorVersion())
	pc, err := csidriver.Identity{}.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	require.NoError(t, err)
	got = nil
	for _, c := range pc.GetCapabilities() {
		if s := c.GetService(); s != nil {
			got = append(got, s.GetType().String())
		}
		if e := c.GetVolumeExpansion(); e != nil {
			got = append(got, "expansion "+e.GetType().String())
		}
	}
	assert.ElementsMatch(t, []string{"CONTROLLER_SERVICE", "expansion ONLINE"}, got)
	probe, err := csidriver.Identity{}.Probe(ctx, &csi.ProbeRequest{})
	require.NoError(t, err)
	assert.True(t, probe.GetReady().GetValue())
}
