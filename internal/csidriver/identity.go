package csidriver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Version is the driver's version in GetPluginInfo. The driver ships inside the release's
// binaries, so the release names its version; this one names the CSI spec it implements.
const Version = "v1.12.0"

// Identity is the CSI identity service, served beside the controller and the node service.
type Identity struct {
	csi.UnimplementedIdentityServer
}

// GetPluginInfo names the driver.
func (Identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: Name, VendorVersion: Version}, nil
}

// GetPluginCapabilities: the plugin has a controller service (served by `csidriver
// controller`; the node half answers the same, as the capability is the plugin's) and expands
// volumes online. Volumes are reachable from every node, so no topology.
func (Identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	caps := []*csi.PluginCapability{{Type: &csi.PluginCapability_VolumeExpansion_{
		VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE},
	}}, {Type: &csi.PluginCapability_Service_{
		Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE},
	}}}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe answers ready: a served driver has nothing left to set up.
func (Identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
