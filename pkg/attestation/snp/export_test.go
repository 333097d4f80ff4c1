package snp

import "io/fs"

// LoadRoots exposes the loader of the pinned roots, to show that it refuses a changed file.
func LoadRoots(fsys fs.FS, fingerprints map[string]string) (*Roots, error) {
	return loadRoots(fsys, fingerprints)
}

// RootsFS and PinnedFingerprints are the embedded roots and their pinned fingerprints.
var (
	RootsFS            = rootsFS
	PinnedFingerprints = pinnedFingerprints
)
