// Package reaper collects orphans re-parented to a child subreaper without taking the exit
// status of the process's own children.
//
// A subreaper (PR_SET_CHILD_SUBREAPER) inherits every orphan of its descendants and must wait
// for them, or they stay zombies. wait4(-1) is the usual way, and wrong for a Go program that
// also runs commands: it takes whichever child exited first, so an exec.Cmd whose status it
// took fails its Wait with ECHILD ("waitid: no child processes") though the command succeeded.
//
// Go's os.Process holds a pidfd for every child it starts on Linux, from start until its Wait
// returns. Reap waits only for exited children the process holds no pidfd for: the orphans.
package reaper

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Reap waits for every exited child of this process that no os.Process of it will wait for,
// without blocking, and returns how many it collected. When the kernel has no pidfds (Go then
// tracks children by PID only) it cannot tell orphans from its own children and reaps none.
func Reap() (int, error) {
	if !pidfdsWork() {
		return 0, errNoPidfd
	}
	zombies, err := exitedChildren(os.Getpid())
	if err != nil || len(zombies) == 0 {
		return 0, err
	}
	// Read after the zombies: a child of ours has its pidfd from before it could exit until its
	// Wait has collected it, so every zombie of ours is still listed here. (A zombie of ours
	// that Wait collects in between is gone; its PID is not reused within these microseconds.)
	own, err := pidfdPIDs()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, pid := range zombies {
		if own[pid] {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			n++
		}
	}
	return n, nil
}

var errNoPidfd = errors.New("reaper: the kernel has no pidfds; orphans are not reaped")

func pidfdsWork() bool {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// exitedChildren returns the PIDs of parent's children that have exited and not been waited
// for (state Z in /proc/PID/stat).
func exitedChildren(parent int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("reaper: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited and reaped meanwhile
		}
		state, ppid, ok := parseStat(stat)
		if ok && state == 'Z' && ppid == parent {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// parseStat returns the state and parent PID from a /proc/PID/stat line. The command name in
// parentheses may hold spaces and parentheses itself, so fields are counted from the last ')'.
func parseStat(stat []byte) (state byte, ppid int, ok bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 2 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return 0, 0, false
	}
	return fields[0][0], ppid, true
}

// pidfdPIDs returns the PIDs this process holds pidfds for.
func pidfdPIDs() (map[int]bool, error) {
	infos, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		return nil, fmt.Errorf("reaper: %w", err)
	}
	pids := map[int]bool{}
	for _, e := range infos {
		// Only a pidfd's fdinfo has a Pid line (its link reads anon_inode:[pidfd] or, from
		// Linux 6.9, pidfd:[inode]).
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		for line := range strings.SplitSeq(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "Pid:"); ok {
				if pid, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					pids[pid] = true
				}
			}
		}
	}
	return pids, nil
}
