package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CgroupFS is where the cgroup hierarchies are mounted.
const CgroupFS = "/sys/fs/cgroup"

// Cgroup is one cgroup path, the same in every hierarchy (cgroup v1 and the unified one),
// below the cgroup of the process that created it: a cluster's processes stay inside the
// limits of whoever started it. The kubelet's cgroupRoot is a Cgroup too, so everything a
// node runs, its pods included, is found below the node's Cgroup.
type Cgroup string

// NewCgroup returns the cgroup rel (e.g. "cmini-ab12/node-0") below this process's own.
// The base is this process's memory cgroup, the controller resource limits come from here.
func NewCgroup(rel string) (Cgroup, error) {
	base, err := ownCgroup("memory")
	if err != nil {
		return "", err
	}
	return Cgroup(filepath.Join(base, rel)), nil
}

// Child is a cgroup below c.
func (c Cgroup) Child(name string) Cgroup { return Cgroup(filepath.Join(string(c), name)) }

// hierarchies are the mounted hierarchies (directories below CgroupFS).
func hierarchies() ([]string, error) {
	if _, err := os.Stat(filepath.Join(CgroupFS, "cgroup.controllers")); err == nil {
		return []string{CgroupFS}, nil // cgroup v2 only: one hierarchy
	}
	entries, err := os.ReadDir(CgroupFS)
	if err != nil {
		return nil, fmt.Errorf("listing cgroup hierarchies: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join(CgroupFS, e.Name()))
		}
	}
	return out, nil
}

// Create makes c in every hierarchy. cpuset cgroups start with no CPUs or memory nodes, so
// they inherit their parent's (the kubelet expects usable cpusets).
func (c Cgroup) Create() error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := filepath.Join(h, string(c))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) == "cpuset" {
			if err := initCpuset(h, string(c)); err != nil {
				return err
			}
		}
	}
	return nil
}

func initCpuset(h, rel string) error {
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	dir := h
	for _, p := range parts {
		parent := dir
		dir = filepath.Join(dir, p)
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			cur, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return fmt.Errorf("reading %s: %w", filepath.Join(dir, f), err)
			}
			if strings.TrimSpace(string(cur)) != "" {
				continue
			}
			val, err := os.ReadFile(filepath.Join(parent, f))
			if err != nil {
				return fmt.Errorf("reading %s: %w", filepath.Join(parent, f), err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), val, 0o644); err != nil {
				return fmt.Errorf("writing %s: %w", filepath.Join(dir, f), err)
			}
		}
	}
	return nil
}

// Procs returns the cgroup.procs files of c in every hierarchy, for a launcher that puts
// itself into c before it starts anything (so no child escapes).
func (c Cgroup) Procs() ([]string, error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, h := range hs {
		out = append(out, filepath.Join(h, string(c), "cgroup.procs"))
	}
	return out, nil
}

// Add moves pid into c in every hierarchy.
func (c Cgroup) Add(pid int) error {
	files, err := c.Procs()
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("moving %d into %s: %w", pid, f, err)
		}
	}
	return nil
}

// Pids lists every process in c and below it, in any hierarchy.
func (c Cgroup) Pids() ([]int, error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	for _, h := range hs {
		root := filepath.Join(h, string(c))
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if !d.IsDir() {
				return nil
			}
			f, err := os.Open(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("listing processes of cgroup %s: %w", root, err)
		}
	}
	pids := make([]int, 0, len(seen))
	for p := range seen {
		pids = append(pids, p)
	}
	sort.Ints(pids)
	return pids, nil
}

// Kill ends every process in c and below (freezing first where the freezer exists, so
// nothing forks while it is being killed) and waits until none is left.
func (c Cgroup) Kill(ctx context.Context) error { return c.KillFrozen(ctx, nil) }

// KillFrozen is Kill that runs whileFrozen (if not nil) once c is frozen, before any of its
// processes is killed: a power cut ends a node's processes and its TPM, which runs outside
// the node's cgroup, at one instant, so that no process of the node sees its TPM go. Where
// the freezer is missing, whileFrozen runs right before the kill.
func (c Cgroup) KillFrozen(ctx context.Context, whileFrozen func()) error {
	freezer := filepath.Join(CgroupFS, "freezer", string(c), "freezer.state")
	frozen := os.WriteFile(freezer, []byte("FROZEN"), 0o644) == nil
	thaw := func() {
		if frozen {
			_ = os.WriteFile(freezer, []byte("THAWED"), 0o644)
			frozen = false
		}
	}
	// Never left frozen, also when it was empty (a machine that powered itself off): the
	// node's next boot starts its processes in the same cgroup, where they would freeze at
	// once.
	defer thaw()
	if whileFrozen != nil {
		whileFrozen()
	}
	for {
		pids, err := c.Pids()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		thaw()
		select {
		case <-ctx.Done():
			return fmt.Errorf("processes %v of cgroup %s did not exit: %w", pids, c, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Remove deletes c and everything below it in every hierarchy (after Kill).
func (c Cgroup) Remove() error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		root := filepath.Join(h, string(c))
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		// Deepest first: a cgroup directory can only be removed once it has no children.
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Exists reports whether c exists in any hierarchy.
func (c Cgroup) Exists() bool {
	hs, _ := hierarchies()
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h, string(c))); err == nil {
			return true
		}
	}
	return false
}

// ownCgroup returns this process's cgroup path in controller (v1), or in the unified
// hierarchy when the controller is not mounted on its own.
func ownCgroup(controller string) (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("reading own cgroup: %w", err)
	}
	unified := "/"
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			unified = parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return parts[2], nil
			}
		}
	}
	return unified, nil
}

// SignalCommand sends sig to every process in c and below whose command name (its comm, as
// in /proc/PID/comm) is comm, and returns their PIDs. A process that exits meanwhile is no
// error.
func (c Cgroup) SignalCommand(comm string, sig syscall.Signal) ([]int, error) {
	pids, err := c.Pids()
	if err != nil {
		return nil, err
	}
	var out []int
	for _, p := range pids {
		name, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p))
		if err != nil || strings.TrimSpace(string(name)) != comm {
			continue
		}
		if err := syscall.Kill(p, sig); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// WaitGone waits until none of pids is a live process (zombies count as gone: the provider
// reaps them every few seconds), or ctx ends.
func WaitGone(ctx context.Context, pids []int) error {
	for {
		alive := slices.DeleteFunc(slices.Clone(pids), func(p int) bool {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
			if err != nil {
				return true
			}
			i := strings.LastIndexByte(string(stat), ')')
			return i > 0 && strings.HasPrefix(string(stat[i+1:]), " Z")
		})
		if len(alive) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("processes %v still run: %w", alive, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
