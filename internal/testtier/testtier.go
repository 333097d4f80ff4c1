// Package testtier sorts tests into the tiers the Makefile runs (README.md "Tests"):
//
//   - unit (`make unit`, go test -short): Go code only, with the go-tpm-tools simulator as
//     the TPM; no root, no Kubernetes build, no other process;
//   - integration (`make integration`): real swtpm, gocryptfs, cryptsetup, containerd,
//     etcd and kube-apiserver (from `make kube`), root where a test needs it;
//   - e2e (`make e2e`): test/e2e, whole clusters from the built binaries and images.
//
// A test or helper that needs more than the unit tier calls Integration first, so that
// `go test -short ./...` passes on any machine with Go and nothing else.
package testtier

import "testing"

// Integration skips t in the unit tier (go test -short); needs says what t runs that the unit
// tier does not have, e.g. "swtpm" or "etcd and kube-apiserver".
func Integration(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("integration tier (make integration): runs %s", needs)
	}
}
