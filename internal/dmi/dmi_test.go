package dmi_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/dmi"
)

func TestRead(t *testing.T) {
	testCases := map[string]struct {
		files   map[string]string
		noDir   bool
		want    dmi.Info
		wantErr string
	}{
		"qemu": {
			files: map[string]string{"sys_vendor": "QEMU\n", "product_name": "Standard PC (Q35 + ICH9, 2009)\n", "chassis_asset_tag": "\n"},
			want:  dmi.Info{SysVendor: "QEMU", ProductName: "Standard PC (Q35 + ICH9, 2009)"},
		},
		"azure": {
			files: map[string]string{"sys_vendor": "Microsoft Corporation\n", "product_name": "Virtual Machine\n", "chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77\n"},
			want:  dmi.Info{SysVendor: "Microsoft Corporation", ProductName: "Virtual Machine", ChassisAssetTag: "7783-7084-3265-9085-8269-3286-77"},
		},
		"missing files": {files: map[string]string{"sys_vendor": "QEMU"}, want: dmi.Info{SysVendor: "QEMU"}},
		"no DMI":        {noDir: true, wantErr: "reading the machine's DMI facts"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.noDir {
				dir = filepath.Join(dir, "absent")
			}
			for f, content := range tc.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte(content), 0o644))
			}
			got, err := dmi.Read(dir)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
