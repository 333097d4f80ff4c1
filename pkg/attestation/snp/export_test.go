package snp

import "io/fs"

// SkipRevocationForRealSamples turns off the CRL check of v. Only the tests of AMD's real
// samples use it: no CRL signed by AMD's real ARK is available offline (testdata/README.md).
// Revocation is tested with fake AMD roots, which sign their own CRLs.
func SkipRevocationForRealSamples(v *Validator) { v.skipRevocation = true }

// LoadRoots exposes the loader of the pinned roots, to show that it refuses a changed file.
func LoadRoots(fsys fs.FS, fingerprints map[string]string) (*Roots, error) {
	return loadRoots(fsys, fingerprints)
}

// RootsFS and PinnedFingerprints are the embedded roots and their pinned fingerprints.
var (
	RootsFS            = rootsFS
	PinnedFingerprints = pinnedFingerprints
)
