package cli

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVerifyEvidenceEmpty: an empty evidence file, empty standard input, or a verification
// service's answer with empty evidence is refused as malformed evidence (not as evidence of
// another variant), for verification and for --list-collateral alike.
func TestVerifyEvidenceEmpty(t *testing.T) {
	f := newEvidenceFixture(t)
	empty := filepath.Join(f.dir, "empty.bin")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	emptyAnswer := filepath.Join(f.dir, "empty-answer.json")
	require.NoError(t, os.WriteFile(emptyAnswer, []byte(`{"variant":"qemu-vtpm","evidence":""}`), 0o600))

	for name, tc := range map[string]struct {
		file string
		in   string
		list bool
		want string
	}{
		"empty file":                    {file: empty, want: "evidence refused (malformed)"},
		"empty standard input":          {file: "-", want: "evidence refused (malformed)"},
		"answer with empty evidence":    {file: emptyAnswer, want: "evidence refused (malformed)"},
		"empty file, --list-collateral": {file: empty, list: true, want: "malformed evidence"},
	} {
		t.Run(name, func(t *testing.T) {
			o := f.opts()
			o.nonce = hex.EncodeToString(f.nonce)
			o.listCollateral = tc.list
			err := runVerifyEvidence(context.Background(), &bytes.Buffer{}, strings.NewReader(tc.in), tc.file, o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "wrong-variant")
		})
	}
}
