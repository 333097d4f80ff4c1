package nodes_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/dmi"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/provider/catalog/instances"
	"github.com/openconstellation/constellation/internal/provider/catalog/nodes"
)

// Every node platform is a provider of the CLI's catalog, and its services find its metadata
// client under the same name (deploy passes the node platform's name as --platform).
func TestNodePlatformsAreProviders(t *testing.T) {
	require.NotEmpty(t, nodes.Names())
	for _, name := range nodes.Names() {
		_, err := catalog.Lookup(name)
		assert.NoError(t, err, "CLI provider %q", name)
		_, err = instances.Lookup(name)
		assert.NoError(t, err, "services' metadata client of %q", name)
	}
}

func TestLookup(t *testing.T) {
	testCases := map[string]struct {
		name    string
		wantErr string
	}{
		"default": {name: ""},
		"local":   {name: "local"},
		"unknown": {name: "qemu-nope", wantErr: `node platform "qemu-nope" is not supported (supported: azure, local, qemu)`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			newPlatform, err := nodes.Lookup(tc.name)
			if tc.wantErr != "" {
				assert.EqualError(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			p, err := newPlatform(boot.PlatformConfig{NodeDir: t.TempDir(), ImageDir: t.TempDir()})
			require.NoError(t, err)
			assert.Equal(t, nodes.Default, p.Name())
			// The platform's facts are what deploy accepts.
			assert.NoError(t, p.Services().Validate())
			assert.Equal(t, p.Name(), p.Services().Name)
		})
	}
}

// The node OS image tells its platform by what real firmware says: QEMU with OVMF, and Azure's
// VMs (their chassis asset tag; Hyper-V elsewhere says "Microsoft Corporation" too).
func TestDetect(t *testing.T) {
	testCases := map[string]struct {
		info    dmi.Info
		want    string
		wantErr string
	}{
		"qemu q35": {info: dmi.Info{SysVendor: "QEMU", ProductName: "Standard PC (Q35 + ICH9, 2009)"}, want: "qemu"},
		"azure": {
			info: dmi.Info{SysVendor: "Microsoft Corporation", ProductName: "Virtual Machine", ChassisAssetTag: "7783-7084-3265-9085-8269-3286-77"},
			want: "azure",
		},
		"hyper-v, not azure": {
			info:    dmi.Info{SysVendor: "Microsoft Corporation", ProductName: "Virtual Machine"},
			wantErr: `no node platform claims this machine (sys_vendor "Microsoft Corporation", product_name "Virtual Machine", chassis_asset_tag ""): name it with --platform (supported: azure, local, qemu)`,
		},
		"bare metal": {info: dmi.Info{SysVendor: "Dell Inc."}, wantErr: `no node platform claims this machine (sys_vendor "Dell Inc."`},
		"nothing":    {wantErr: "no node platform claims this machine"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := nodes.Detect(tc.info)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			_, err = nodes.Lookup(got)
			assert.NoError(t, err)
		})
	}
}
