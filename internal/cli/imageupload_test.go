package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestImageUploadRefuses(t *testing.T) {
	testCases := map[string]struct {
		args    []string
		wantErr string
	}{
		"a provider without an image store": {args: []string{"image", "upload", "local", "--image", "x", "--version", "1.0.0"}, wantErr: "provider local keeps no node OS images"},
		"an unknown provider":               {args: []string{"image", "upload", "gcp", "--image", "x", "--version", "1.0.0"}, wantErr: `provider "gcp" is not supported by this CLI`},
		"a setting without a value":         {args: []string{"image", "upload", "azure", "--image", "x", "--version", "1.0.0", "--set", "location"}, wantErr: `--set "location": want KEY=VALUE`},
		"a setting twice":                   {args: []string{"image", "upload", "azure", "--image", "x", "--version", "1.0.0", "--set", "location=a", "--set", "location=b"}, wantErr: "--set: location is given twice"},
		"an unknown setting": {
			args:    []string{"image", "upload", "azure", "--image", "x", "--version", "1.0.0", "--set", "region=westeurope"},
			wantErr: "unknown settings region",
		},
		"no version": {args: []string{"image", "upload", "azure", "--image", "x"}, wantErr: `required flag(s) "version" not set`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := run(t, tc.args...)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}
