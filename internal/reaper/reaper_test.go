package reaper

import (
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestReapTakesOrphansOnly: while Reap runs in a tight loop in a subreaper, commands the
// process runs itself all see their own exit status, and an orphan re-parented to it is
// collected.
func TestReapTakesOrphansOnly(t *testing.T) {
	require.NoError(t, unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })

	// The shell's background child outlives it and is re-parented here; it prints its PID.
	out, err := exec.Command("sh", "-c", `sleep 0.2 & echo $!`).Output()
	require.NoError(t, err)
	orphan, err := strconv.Atoi(string(out[:len(out)-1]))
	require.NoError(t, err)

	stop := make(chan struct{})
	var reaped int
	var reaperDone sync.WaitGroup
	reaperDone.Add(1)
	go func() {
		defer reaperDone.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := Reap()
			assert.NoError(t, err)
			reaped += n
		}
	}()

	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for range 4 {
		wg.Go(func() {
			for range 50 {
				// exit 3: a stolen status would show as ECHILD, not as this exit code.
				err := exec.Command("sh", "-c", "exit 3").Run()
				var exit *exec.ExitError
				if !assert.ErrorAs(t, err, &exit) || exit.ExitCode() != 3 {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a command of the process lost its exit status: %v", err)
	}

	// The orphan exits after 0.2 s; poll until it is collected.
	require.Eventually(t, func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(orphan))
		return os.IsNotExist(err)
	}, 10*time.Second, 20*time.Millisecond, "orphan %d is still a zombie", orphan)
	close(stop)
	reaperDone.Wait()
	assert.Equal(t, 1, reaped, "only the orphan was reaped")
}

func TestParseStat(t *testing.T) {
	testCases := map[string]struct {
		stat      string
		wantState byte
		wantPPID  int
		wantOK    bool
	}{
		"plain":                          {stat: "28777 (python3) Z 28736 28734 21015 0", wantState: 'Z', wantPPID: 28736, wantOK: true},
		"name with spaces and parens":    {stat: "5 (a) R 1 (b)) S 42 5 5 0", wantState: 'S', wantPPID: 42, wantOK: true},
		"name that mimics a zombie line": {stat: "5 (x) Z 1) R 7 5", wantState: 'R', wantPPID: 7, wantOK: true},
		"no name":                        {stat: "5 Z 1"},
		"truncated":                      {stat: "5 (x) Z"},
		"parent not a number":            {stat: "5 (x) Z y"},
		"empty":                          {},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			state, ppid, ok := parseStat([]byte(tc.stat))
			assert.Equal(t, tc.wantOK, ok)
			if tc.wantOK {
				assert.Equal(t, string(tc.wantState), string(state))
				assert.Equal(t, tc.wantPPID, ppid)
			}
		})
	}
}
