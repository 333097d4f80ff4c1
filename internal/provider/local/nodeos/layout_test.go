package nodeos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/openconstellation/constellation/internal/statedisk"
)

// File system types (statfs f_type).
const (
	fuseMagic    = 0x65735546
	overlayMagic = 0x794c7630
	tmpfsMagic   = 0x01021994
)

// testNode is a node's file system put together below a temporary directory the way Boot and
// MountState put it together at "/": host/ stands for the host's root (the lower layers),
// run/ is the node's /run tmpfs with the volatile layers and the storage's mount point, disk/
// is the storage's backing folder (the node folder's state/).
type testNode struct {
	tmp     string
	l       layout
	storage *statedisk.Gocryptfs
	key     []byte
}

// newTestNode makes the folders and the storage; boot mounts them. Every mount below the
// temporary directory, and the gocryptfs daemon, is gone when the test ends, whatever it did.
func newTestNode(t *testing.T) *testNode {
	t.Helper()
	tmp := privateTempDir(t)

	n := &testNode{tmp: tmp, l: layout{root: filepath.Join(tmp, "host"), volatile: filepath.Join(tmp, "run", "volatile")}}
	require.NoError(t, os.MkdirAll(n.l.path("etc"), 0o755))
	require.NoError(t, os.WriteFile(n.l.path("etc", "hosts"), []byte("the host's hosts\n"), 0o644))
	// A host with a containerd of its own: its registry hosts are not the node's.
	require.NoError(t, os.MkdirAll(n.l.path("etc", "containerd", "certs.d", "docker.io"), 0o755))
	require.NoError(t, os.WriteFile(n.l.path("etc", "containerd", "certs.d", "docker.io", "hosts.toml"), []byte("# the host's\n"), 0o644))
	require.NoError(t, os.MkdirAll(n.l.path("var", "lib", "dpkg"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(tmp, "run"), 0o755))
	// The host's view of its own directories, without the node's mounts on top.
	require.NoError(t, os.MkdirAll(filepath.Join(tmp, "hostview"), 0o755))
	require.NoError(t, syscall.Mount(n.l.root, filepath.Join(tmp, "hostview"), "", syscall.MS_BIND, ""))

	n.storage = &statedisk.Gocryptfs{Dir: filepath.Join(tmp, "disk"), MountPoint: filepath.Join(tmp, "run", "state")}
	var err error
	n.key, err = statedisk.NewRandomKey()
	require.NoError(t, err)
	require.NoError(t, n.storage.Create(context.Background(), n.key))
	return n
}

// boot mounts the node's /run tmpfs and volatile overlays (Boot), and unlocks the storage.
func (n *testNode) boot(t *testing.T) {
	t.Helper()
	require.NoError(t, syscall.Mount("tmpfs", filepath.Join(n.tmp, "run"), "tmpfs", 0, "mode=755"))
	require.NoError(t, n.l.mountVolatile())
	require.NoError(t, n.storage.Unlock(context.Background(), n.key))
}

// shutdown unmounts everything the node mounted, as the end of its mount namespace does.
func (n *testNode) shutdown(t *testing.T) {
	t.Helper()
	unmountBelow(t, n.l.root, filepath.Join(n.tmp, "run"))
}

// unmountBelow detaches every mount at or below dirs, newest first, and makes sure the
// gocryptfs daemons serving storage below them are gone. A daemon exits when the last mount
// of its file system is; a mount namespace someone else created meanwhile holds copies of
// these mounts (the tests of this repository create nodes' namespaces), so it is killed when
// it does not exit: a second daemon on the same storage must never run beside it.
func unmountBelow(t *testing.T, dirs ...string) {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	below := func(mp string) bool {
		for _, dir := range dirs {
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				return true
			}
		}
		return false
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		fields := strings.Fields(lines[i])
		if len(fields) < 5 || !below(fields[4]) {
			continue
		}
		if err := syscall.Unmount(fields[4], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("unmounting %s: %v", fields[4], err)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		var left []int
		for _, dir := range dirs {
			left = append(left, processesMentioning(dir)...)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Logf("killing %v: still running after its mounts are gone here (held by another mount namespace)", left)
			for _, pid := range left {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			deadline = time.Now().Add(3 * time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func processesMentioning(s string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func fsType(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(path, &st), path)
	return st.Type
}

// mountOptionalFields returns the optional fields (propagation) of the mount at path.
func mountOptionalFields(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	var found []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 6 && fields[4] == path {
			found = nil
			for _, f := range fields[6:] {
				if f == "-" {
					break
				}
				found = append(found, f)
			}
		}
	}
	return found
}

const secret = "-----BEGIN PRIVATE KEY----- the cluster CA's key, never on a disk in the clear"

// TestLayout: what persists is on the encrypted storage and outlives a reboot, the rest of
// /etc and /var/lib is volatile and never reaches a disk, the host's directories are never
// written, and nothing is mounted or bound in the storage but the persistent directories.
func TestLayout(t *testing.T) {
	n := newTestNode(t)
	n.boot(t)
	require.NoError(t, n.l.mountState(n.storage.MountPoint), "the host's own registry hosts are no write of the node's")
	_, err := os.Stat(n.l.path("etc", "containerd", "certs.d", "docker.io"))
	assert.ErrorIs(t, err, fs.ErrNotExist, "the node sees its own registry hosts, not the host's")

	for path, want := range map[string]int64{
		"/etc": overlayMagic, "/var/lib": overlayMagic, "/var/lib/kubelet": overlayMagic,
		"/etc/kubernetes": fuseMagic, "/var/lib/kubelet/pki": fuseMagic, "/var/lib/etcd": fuseMagic,
		"/etc/containerd/certs.d": fuseMagic, "/var/lib/constellation/volumes": fuseMagic,
	} {
		assert.Equal(t, fmt.Sprintf("%x", want), fmt.Sprintf("%x", fsType(t, n.l.path(path))), path)
	}
	for _, f := range PersistentFiles {
		target, err := os.Readlink(n.l.path(f))
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(n.storage.MountPoint, f), target, "%s links into the storage", f)
	}
	for _, upper := range []string{"etc", "var-lib"} {
		assert.Equal(t, int64(tmpfsMagic), fsType(t, filepath.Join(n.l.volatile, upper, "upper")), "the upper layer of %s is on the tmpfs", upper)
	}
	// The kubelet leaves a shared root directory as it is (it would bind it onto itself
	// without the persistent directories below it otherwise).
	assert.Contains(t, strings.Join(mountOptionalFields(t, n.l.path(kubeletRoot)), " "), "shared:")

	persistent := map[string]string{
		"/etc/kubernetes/pki/ca.key":              secret,
		"/etc/kubernetes/admin.conf":              "apiVersion: v1\nkind: Config\n",
		"/var/lib/kubelet/config.yaml":            "kind: KubeletConfiguration\n",
		"/var/lib/kubelet/kubeadm-flags.env":      "KUBELET_KUBEADM_ARGS=\"\"\n",
		"/var/lib/kubelet/instance-config.yaml":   "kind: KubeletConfiguration\n",
		"/var/lib/kubelet/pki/kubelet-client.pem": secret,
		"/var/lib/etcd/member/snap/db":            secret,
	}
	volatile := map[string]string{
		"/etc/hosts": "10.42.0.10\tnode\n",
		"/var/lib/cni/networks/constellation/10.244.0.2":                   "container id",
		"/var/lib/kubelet/dra_manager_state":                               "{}",
		"/var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/data/f": secret,
		"/var/lib/kubelet/plugins_registry/reg":                            "",
	}
	for _, files := range []map[string]string{persistent, volatile} {
		for path, content := range files {
			require.NoError(t, os.MkdirAll(filepath.Dir(n.l.path(path)), 0o755))
			require.NoError(t, os.WriteFile(n.l.path(path), []byte(content), 0o600))
		}
	}

	t.Run("nothing in the clear on a disk", func(t *testing.T) {
		// The storage's backing folder and the host's directories are what is on a disk; the
		// volatile layers are on the tmpfs.
		var files int
		for _, dir := range []string{n.storage.Dir, filepath.Join(n.tmp, "hostview")} {
			require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
				require.NoError(t, err)
				for _, name := range []string{"kubernetes", "kubelet", "etcd", "pki", "cni", "ca.key", "pods"} {
					assert.NotEqual(t, name, d.Name(), "plaintext name at %s", path)
				}
				if !d.Type().IsRegular() {
					return nil
				}
				files++
				data, err := os.ReadFile(path)
				require.NoError(t, err)
				assert.NotContains(t, string(data), "PRIVATE KEY", path)
				assert.NotContains(t, string(data), "KubeletConfiguration", path)
				return nil
			}))
		}
		assert.Greater(t, files, len(persistent), "the persistent files are in the storage, encrypted")
		hosts, err := os.ReadFile(filepath.Join(n.tmp, "hostview", "etc", "hosts"))
		require.NoError(t, err)
		assert.Equal(t, "the host's hosts\n", string(hosts), "the host's /etc is never written")
	})

	t.Run("a reboot keeps the persistent directories and nothing else", func(t *testing.T) {
		n.shutdown(t)
		n.boot(t)
		require.NoError(t, n.l.mountState(n.storage.MountPoint))
		for path, content := range persistent {
			data, err := os.ReadFile(n.l.path(path))
			if assert.NoError(t, err, path) {
				assert.Equal(t, content, string(data), path)
			}
		}
		for path := range volatile {
			if path == "/etc/hosts" {
				continue
			}
			_, err := os.Stat(n.l.path(path))
			assert.ErrorIs(t, err, fs.ErrNotExist, path)
		}
		hosts, err := os.ReadFile(n.l.path("/etc/hosts"))
		require.NoError(t, err)
		assert.Equal(t, "the host's hosts\n", string(hosts))
	})

	t.Run("files written before the storage is mounted are refused", func(t *testing.T) {
		n.shutdown(t)
		n.boot(t)
		require.NoError(t, os.MkdirAll(n.l.path("/etc/kubernetes"), 0o755))
		require.NoError(t, os.WriteFile(n.l.path("/etc/kubernetes/early.conf"), nil, 0o600))
		err := n.l.mountState(n.storage.MountPoint)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "early.conf before the state storage is mounted")
	})

	t.Run("the layout of earlier images is refused", func(t *testing.T) {
		n.shutdown(t)
		n.boot(t)
		require.NoError(t, os.MkdirAll(filepath.Join(n.storage.MountPoint, "var-lib", "upper", "kubelet"), 0o755))
		err := n.l.mountState(n.storage.MountPoint)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "layout of an earlier node image")
	})
}

// TestKubeletLoadOnState puts the load of a kubelet and etcd on the node's persistent
// directories, under CPU load: checkpoint files written to a temporary file and renamed into
// place from several goroutines (the kubelet's checkpoint store), and pod volume directories
// created, mounted on, checked after more than FUSE's one-second entry and attribute
// timeouts, and removed. No operation may fail and no mount may be lost.
//
// CONSTELLATION_TEST_UNSAFE_LAYOUTS=1 also runs the layouts this one avoids, to see them fail:
// with the layout before (overlays with their upper layers on the gocryptfs storage) renames
// fail with ESTALE within seconds on our machines, as the kubelet's did ("could not save
// checkpoint dra_manager_state: rename ...: stale file handle"); with pod volumes mounted on
// directories of the storage, a mount is lost now and then (1 to 2 of about 260 in 40 s runs
// of a standalone version of this churn; this row catches it seldom, run it long).
// CONSTELLATION_TEST_LOAD_DURATION (a Go duration) sets how long each runs.
func TestKubeletLoadOnState(t *testing.T) {
	duration := 8 * time.Second
	if d := os.Getenv("CONSTELLATION_TEST_LOAD_DURATION"); d != "" {
		var err error
		duration, err = time.ParseDuration(d)
		require.NoError(t, err)
	}
	tests := map[string]struct {
		// mount mounts the node's state and returns the directories to write checkpoints to
		// and the kubelet's pods directory.
		mount  func(t *testing.T, n *testNode) (dirs []string, pods string)
		unsafe bool
	}{
		"this layout": {
			mount: func(t *testing.T, n *testNode) ([]string, string) {
				require.NoError(t, n.l.mountState(n.storage.MountPoint))
				dirs := []string{n.l.path(kubeletRoot), n.l.path(kubeletRoot, "pki"), n.l.path("/etc/kubernetes"), n.l.path("/var/lib/etcd")}
				return dirs, n.l.path(kubeletRoot, "pods")
			},
		},
		"overlays on the storage (the layout before)": {
			unsafe: true,
			mount: func(t *testing.T, n *testNode) ([]string, string) {
				// The MountState before: /var/lib an overlay with its upper layer in the storage.
				require.NoError(t, overlay(n.l.path("/var/lib"), filepath.Join(n.storage.MountPoint, "var-lib"), true))
				for _, d := range []string{"/var/lib/kubelet/pods", "/var/lib/etcd"} {
					require.NoError(t, os.MkdirAll(n.l.path(d), 0o750))
				}
				return []string{n.l.path(kubeletRoot), n.l.path("/var/lib/etcd")}, n.l.path(kubeletRoot, "pods")
			},
		},
		"pod volumes mounted in the storage": {
			unsafe: true,
			mount: func(t *testing.T, n *testNode) ([]string, string) {
				require.NoError(t, n.l.mountState(n.storage.MountPoint))
				pods := n.l.path("/etc/kubernetes/pods")
				require.NoError(t, os.MkdirAll(pods, 0o750))
				return []string{n.l.path("/etc/kubernetes")}, pods
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.unsafe && os.Getenv("CONSTELLATION_TEST_UNSAFE_LAYOUTS") == "" {
				t.Skip("a layout this one avoids: CONSTELLATION_TEST_UNSAFE_LAYOUTS=1 runs it")
			}
			n := newTestNode(t)
			n.boot(t)
			dirs, pods := tc.mount(t, n)
			r := kubeletLoad(t, dirs, pods, duration)
			t.Logf("%d checkpoint writes, %d pod volumes checked", r.writes, r.volumes)
			assert.Empty(t, r.errors, "failed operations (the first of each kind)")
			assert.Zero(t, r.lostMounts, "pod volume mounts lost")
			assert.Greater(t, r.writes, int64(50), "the load ran")
			assert.Greater(t, r.volumes, int64(2), "the load ran")
		})
	}
}

type loadResult struct {
	writes, volumes, lostMounts int64
	errors                      map[string]string
}

// kubeletLoad runs checkpoint writers in dirs and pod volume churn in pods, with a CPU burner
// per core, until duration passed.
func kubeletLoad(t *testing.T, dirs []string, pods string, duration time.Duration) loadResult {
	t.Helper()
	var (
		r        loadResult
		mu       sync.Mutex
		wg       sync.WaitGroup
		deadline = time.Now().Add(duration)
	)
	r.errors = map[string]string{}
	fail := func(kind string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := r.errors[kind]; !ok {
			r.errors[kind] = err.Error()
		}
	}
	for i := 0; i < runtime.NumCPU(); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for x := 0; time.Now().Before(deadline); x++ {
				_ = x * x
			}
		}()
	}
	// Writers: the kubelet's checkpoint manager, pod status and DRA manager, etcd's files.
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(int64(w)))
			dir := dirs[w%len(dirs)]
			for time.Now().Before(deadline) {
				name := filepath.Join(dir, fmt.Sprintf("checkpoint_state_%d", rnd.Intn(3)))
				data := bytes.Repeat([]byte{byte(w)}, 64+rnd.Intn(4096))
				if err := writeFileAtomic(name, data); err != nil {
					fail("write "+filepath.Base(name)+": "+errnoName(err), err)
				}
				if _, err := os.ReadFile(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
					fail("read: "+errnoName(err), err)
				}
				atomic.AddInt64(&r.writes, 1)
				// Now and then a pause beyond FUSE's entry and attribute timeouts (1 s), so
				// that cached names are revalidated.
				if rnd.Intn(50) == 0 {
					time.Sleep(time.Duration(900+rnd.Intn(400)) * time.Millisecond)
				}
			}
		}(w)
	}
	// Pod volumes: directories made, a tmpfs mounted on each (a secret volume), files made
	// and removed beside it (inode numbers freed and reused), checked after the timeouts.
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				pod := filepath.Join(pods, fmt.Sprintf("pod-%d-%d", w, i))
				vol := filepath.Join(pod, "volumes", "kubernetes.io~secret", "token")
				if err := os.MkdirAll(vol, 0o750); err != nil {
					fail("mkdir: "+errnoName(err), err)
					return
				}
				if err := syscall.Mount("tmpfs", vol, "tmpfs", 0, "size=1m"); err != nil {
					fail("mount: "+errnoName(err), err)
					return
				}
				for j := 0; j < 20; j++ {
					f := filepath.Join(pod, fmt.Sprintf("container-%d", j))
					if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
						fail("pod file: "+errnoName(err), err)
					}
					_ = os.Remove(f)
				}
				time.Sleep(1100 * time.Millisecond)
				var st unix.Statfs_t
				if err := unix.Statfs(vol, &st); err != nil {
					fail("statfs: "+errnoName(err), err)
				} else if st.Type != tmpfsMagic {
					atomic.AddInt64(&r.lostMounts, 1)
				}
				atomic.AddInt64(&r.volumes, 1)
				if err := syscall.Unmount(vol, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
					fail("unmount: "+errnoName(err), err)
				}
				if err := os.RemoveAll(pod); err != nil {
					fail("remove pod: "+errnoName(err), err)
				}
			}
		}(w)
	}
	wg.Wait()
	return r
}

// writeFileAtomic writes as the kubelet's file store does (k8s.io/kubernetes/pkg/util/store):
// a temporary file in the same directory, written, synced, closed, renamed into place.
func writeFileAtomic(path string, data []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), ".")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func errnoName(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return "other"
}
