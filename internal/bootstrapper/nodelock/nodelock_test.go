package nodelock_test

import (
	"errors"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/bootstrapper/nodelock"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// Init and join race on one node with a real (swtpm) TPM: exactly one wins, and PCR 15 is
// extended exactly once, with the winner's cluster ID.
func TestInitAndJoinRace(t *testing.T) {
	for round := range 20 {
		tpm, _ := vtpmtest.Swtpm(t)
		lock, err := nodelock.New(tpm, variant.QEMUVTPM)
		require.NoError(t, err)
		ids := map[string][]byte{"init": []byte("cluster-of-init"), "join": []byte("cluster-of-join")}
		results := map[string]error{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for holder, id := range ids {
			wg.Go(func() {
				<-start
				err := lock.TryLock(holder, id)
				mu.Lock()
				results[holder] = err
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()

		var winner string
		for holder, err := range results {
			if err == nil {
				require.Empty(t, winner, "round %d: two winners", round)
				winner = holder
			} else {
				assert.ErrorIs(t, err, nodelock.ErrLocked)
			}
		}
		require.NotEmpty(t, winner, "round %d: nobody won", round)
		assert.Equal(t, winner, lock.Holder())
		pcrs, err := tpm.ReadPCRs(int(markerRegister))
		require.NoError(t, err)
		assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(ids[winner]), pcrs[markerRegister], "round %d: PCR 15 extended once, by %s", round, winner)
	}
}

func TestSecondAttempt(t *testing.T) {
	tpm, _ := vtpmtest.Swtpm(t)
	lock, err := nodelock.New(tpm, variant.QEMUVTPM)
	require.NoError(t, err)
	require.NoError(t, lock.TryLock("init", []byte("cluster-a")))
	err = lock.TryLock("init", []byte("cluster-a"))
	assert.ErrorIs(t, err, nodelock.ErrLocked)
	assert.ErrorContains(t, err, "taken by init")
	pcrs, err := tpm.ReadPCRs(int(markerRegister))
	require.NoError(t, err)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker([]byte("cluster-a")), pcrs[markerRegister], "no second extend")

	// The bootstrapper restarts in the same boot: the TPM remembers.
	again, err := nodelock.New(tpm, variant.QEMUVTPM)
	require.NoError(t, err)
	err = again.TryLock("join", []byte("cluster-b"))
	assert.ErrorContains(t, err, "taken by earlier in this boot")
	assert.ErrorContains(t, again.TryLock("join", nil), "empty cluster ID")

	// Resuming for another cluster is refused; for this cluster it succeeds without a
	// second extend.
	assert.ErrorIs(t, again.Resume("rejoin", []byte("cluster-b")), nodelock.ErrOtherCluster)
	require.NoError(t, again.Resume("rejoin", []byte("cluster-a")))
	assert.Equal(t, "rejoin (resumed)", again.Holder())
	pcrs, err = tpm.ReadPCRs(int(markerRegister))
	require.NoError(t, err)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker([]byte("cluster-a")), pcrs[markerRegister], "no second extend")
	// Resumed once: the lock has its winner.
	err = again.Resume("recover", []byte("cluster-a"))
	assert.ErrorIs(t, err, nodelock.ErrLocked)
	assert.ErrorContains(t, err, "taken by rejoin (resumed)")
	// A lock taken in this process is not resumed either.
	assert.ErrorIs(t, lock.Resume("rejoin", []byte("cluster-a")), nodelock.ErrLocked)
}

// The rejoin client and the recovery server of a rebooted node race for the lock, on a
// fresh boot (free lock) and after a bootstrapper restart (lock found taken): exactly one
// wins, and PCR 15 carries the cluster's marker exactly once.
func TestResumeRace(t *testing.T) {
	id := []byte("cluster-a")
	for name, restarted := range map[string]bool{"lock free": false, "bootstrapper restarted": true} {
		t.Run(name, func(t *testing.T) {
			for round := range 10 {
				tpm, _ := vtpmtest.Swtpm(t)
				if restarted {
					first, err := nodelock.New(tpm, variant.QEMUVTPM)
					require.NoError(t, err)
					require.NoError(t, first.TryLock("rejoin", id))
				}
				lock, err := nodelock.New(tpm, variant.QEMUVTPM)
				require.NoError(t, err)
				results := map[string]error{}
				var mu sync.Mutex
				var wg sync.WaitGroup
				start := make(chan struct{})
				for _, holder := range []string{"rejoin", "recover"} {
					wg.Go(func() {
						<-start
						err := lock.Resume(holder, id)
						mu.Lock()
						results[holder] = err
						mu.Unlock()
					})
				}
				close(start)
				wg.Wait()
				var winners []string
				for holder, err := range results {
					if err == nil {
						winners = append(winners, holder)
					} else {
						assert.ErrorIs(t, err, nodelock.ErrLocked, "round %d", round)
					}
				}
				require.Len(t, winners, 1, "round %d: %v", round, results)
				assert.Contains(t, lock.Holder(), winners[0])
				pcrs, err := tpm.ReadPCRs(int(markerRegister))
				require.NoError(t, err)
				assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(id), pcrs[markerRegister], "round %d: one extend", round)
			}
		})
	}
}

// Resume on a free lock takes it like TryLock.
func TestResumeFreeLock(t *testing.T) {
	tpm, _ := vtpmtest.Swtpm(t)
	lock, err := nodelock.New(tpm, variant.QEMUVTPM)
	require.NoError(t, err)
	require.NoError(t, lock.Resume("rejoin", []byte("cluster-a")))
	assert.Equal(t, "rejoin", lock.Holder())
	pcrs, err := tpm.ReadPCRs(int(markerRegister))
	require.NoError(t, err)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker([]byte("cluster-a")), pcrs[markerRegister])
}

type failingTPM struct {
	nodelock.TPM
	extendErr error
	applied   bool // the extend reached the TPM although an error was reported
}

func (f *failingTPM) ExtendPCR(idx int, digest []byte) error {
	if f.applied {
		_ = f.TPM.ExtendPCR(idx, digest)
	}
	return f.extendErr
}

func TestExtendFails(t *testing.T) {
	for name, applied := range map[string]bool{"not applied": false, "applied, response lost": true} {
		t.Run(name, func(t *testing.T) {
			tpm, _ := vtpmtest.Swtpm(t)
			f := &failingTPM{TPM: tpm, extendErr: errors.New("TPM gone"), applied: applied}
			lock, err := nodelock.New(f, variant.QEMUVTPM)
			require.NoError(t, err)
			assert.ErrorContains(t, lock.TryLock("join", []byte("c")), "TPM gone")
			f.extendErr = nil
			err = lock.TryLock("join", []byte("c"))
			if applied {
				assert.ErrorIs(t, err, nodelock.ErrLocked, "the node is marked: no second extend")
			} else {
				assert.NoError(t, err, "nothing happened: the lock is still free")
			}
		})
	}
}

// markerRegister is the cluster-ID register of the variant the tests lock with.
var markerRegister, _ = variant.QEMUVTPM.ClusterIDRegister()
