package nodeimage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/openconstellation/constellation/internal/imageload"
	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/testtier"
)

// containerd is a containerd started for one test.
type containerd struct {
	socket string
	ctr    string
	pid    int
	mem    string // the tmpfs of root and state, in containerd's mount namespace
}

// startContainerd starts Debian's containerd with its own config, socket, root and state, the
// root and state on a tmpfs as on a node (/run). The tmpfs is mounted in a private mount
// namespace of containerd, so it goes away with containerd. Stopped (by PID) when t ends.
func startContainerd(t *testing.T) *containerd {
	t.Helper()
	testtier.Integration(t, "containerd, as root")
	bin, err := exec.LookPath("containerd")
	require.NoError(t, err, "containerd is not installed (make deps)")
	ctr, err := exec.LookPath("ctr")
	require.NoError(t, err, "ctr is not installed (make deps)")
	_, err = exec.LookPath("runc")
	require.NoError(t, err, "runc is not installed (make deps)")

	// Short: the socket path must fit a unix socket address.
	dir, err := os.MkdirTemp("", "ctd-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	mem := filepath.Join(dir, "mem")
	require.NoError(t, os.Mkdir(mem, 0o700))
	socket := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  # The machine's root lacks CAP_SYS_RESOURCE: without this, sandboxes fail to start.
  restrict_oom_score_adj = true
  sandbox_image = %[6]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = %[7]q
`, filepath.Join(mem, "root"), filepath.Join(mem, "state"), socket, socket+".ttrpc",
		filepath.Join(dir, "opt"), defaultPauseRef(t), filepath.Join(dir, "cni"))
	cfgPath := filepath.Join(dir, "config.toml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(config), 0o600))

	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	require.NoError(t, err)
	// unshare and sh exec into containerd: the PID is containerd's.
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount -t tmpfs -o mode=0700 tmpfs "$1" && exec "$2" --config "$3"`,
		"sh", mem, bin, cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			if log, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("containerd log:\n%s", tail(string(log)))
			}
		}
	})
	c := &containerd{socket: socket, ctr: ctr, pid: cmd.Process.Pid, mem: mem}
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			log, _ := os.ReadFile(logf.Name())
			require.FailNow(t, "containerd exited", "%s", log)
		default:
		}
		_, err := c.run(context.Background(), "version")
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "containerd did not come up")
	return c
}

// run runs ctr against c in namespace k8s.io, in containerd's mount namespace: `ctr run` mounts
// the image's snapshot itself (to read users and groups), and the snapshots are on the tmpfs
// only containerd's mount namespace has, as a node's are in its own.
// memUsed returns the bytes used on containerd's tmpfs (its root and state: blobs and
// unpacked snapshots), seen through its mount namespace.
func (c *containerd) memUsed(t *testing.T) uint64 {
	t.Helper()
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(fmt.Sprintf("/proc/%d/root%s", c.pid, c.mem), &st))
	return (st.Blocks - st.Bfree) * uint64(st.Bsize)
}

func (c *containerd) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--target", strconv.Itoa(c.pid), "--mount", "--",
		c.ctr, "--address", c.socket, "--namespace", "k8s.io"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// criImage asks the CRI image service, as kubelet does, for an image by ref.
func (c *containerd) criImage(t *testing.T, ref string) *runtimeapi.Image {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := runtimeapi.NewImageServiceClient(conn).ImageStatus(ctx,
		&runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	require.NoError(t, err)
	return resp.GetImage()
}

// unpacked returns the refs that `ctr images check` reports complete and unpacked.
func (c *containerd) unpacked(t *testing.T) map[string]bool {
	t.Helper()
	out, err := c.run(context.Background(), "images", "check")
	require.NoError(t, err)
	refs := map[string]bool{}
	for _, line := range strings.Split(out, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 0 && strings.Contains(line, "complete") && f[len(f)-1] == "true" {
			refs[f[0]] = true
		}
	}
	return refs
}

func containerID(t *testing.T, prefix string) string {
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return prefix + "-" + hex.EncodeToString(b)
}

// removeContainer kills and removes a container started with `ctr run -d`.
func (c *containerd) removeContainer(id string) {
	ctx := context.Background()
	_, _ = c.run(ctx, "task", "kill", "--signal", "SIGKILL", id)
	for range 50 {
		if _, err := c.run(ctx, "task", "delete", id); err == nil || !c.taskExists(id) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, _ = c.run(ctx, "container", "delete", id)
}

// taskStatus returns the status column of `ctr task ls` for id, or "" when there is no task.
func (c *containerd) taskStatus(id string) string {
	out, err := c.run(context.Background(), "task", "ls")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == id {
			return f[2]
		}
	}
	return ""
}

func (c *containerd) taskExists(id string) bool { return c.taskStatus(id) != "" }

// netNamespace returns a new network namespace with its loopback up, as `ctr run --with-ns`
// takes it, held by a sleeping process until the test ends.
func netNamespace(t *testing.T) string {
	holder := exec.Command("unshare", "--net", "--", "sh", "-c", "ip link set lo up && exec sleep 600")
	require.NoError(t, holder.Start())
	t.Cleanup(func() {
		_ = holder.Process.Kill()
		_ = holder.Wait()
	})
	ns := fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid)
	// The namespace is the holder's once sh has brought lo up and become sleep.
	require.Eventually(t, func() bool {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", holder.Process.Pid))
		return err == nil && strings.TrimSpace(string(comm)) == "sleep"
	}, 10*time.Second, 10*time.Millisecond, "the namespace's holder did not start")
	return "network:" + ns
}

// A kube-proxy-like nftables ruleset (from the nftables proxier's structure), listed back.
const kubeProxyRules = `table inet kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
	}
	chain service-test {
		ip daddr set 10.244.1.5 counter
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
}
add element inet kube-proxy service-ips { 10.96.0.10 . tcp . 53 : goto service-test }
`

// TestImportAndRun builds images from real binaries, imports them into a real containerd and
// runs them there: what every node does at boot.
func TestImportAndRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pauseBin := buildStatic(t, "../../cmd/pause")
	helloBin := buildStatic(t, "../../test/e2e/hello")
	nft, err := exec.LookPath("nft")
	require.NoError(t, err, "nft is not installed (make deps)")
	rules := writeInput(t, t.TempDir(), "rules.nft", kubeProxyRules, 0o644)

	// kube-proxy's image as the catalog makes it, with the hello binary standing in for
	// kube-proxy and a ruleset for nft.
	proxy, err := KubeProxy(helloBin, nft, kubeversion.Default)
	require.NoError(t, err)
	proxy.Spec.Files = append(proxy.Spec.Files, File{Src: rules, Path: "/rules.nft"})
	services, err := Services(pauseBin)
	require.NoError(t, err)
	hello, err := Hello(helloBin)
	require.NoError(t, err)
	images := []Image{Pause(pauseBin, defaultRelease(t)), services, hello, proxy}
	dir := t.TempDir()
	idx, _, err := BuildAll(dir, images)
	require.NoError(t, err)

	c := startContainerd(t)
	start := time.Now()
	require.NoError(t, Import(ctx, c.ctr, c.socket, "k8s.io", idx.Files(dir)...))
	t.Logf("imported %d images in %v", len(images), time.Since(start).Round(time.Millisecond))

	// kubelet finds every image through the CRI, unpacked for the CRI's snapshotter.
	unpacked := c.unpacked(t)
	for _, img := range images {
		got := c.criImage(t, img.Spec.Ref)
		if assert.NotNil(t, got, "CRI knows %s", img.Spec.Ref) {
			assert.Contains(t, got.RepoTags, img.Spec.Ref)
		}
		assert.True(t, unpacked[img.Spec.Ref], "%s is unpacked", img.Spec.Ref)
	}
	assert.Nil(t, c.criImage(t, "registry.k8s.io/pause:0.0.0"), "CRI does not make up images")

	t.Run("hello serves its pod name", func(t *testing.T) {
		// The server and its client run in a network namespace of their own, as pods do: no
		// port on the machine can be taken by another test meanwhile.
		netns := netNamespace(t)
		id := containerID(t, "hello")
		logPath := filepath.Join(t.TempDir(), "hello.log")
		_, err := c.run(ctx, "run", "-d", "--with-ns", netns, "--log-uri", "file://"+logPath,
			"--env", "POD_NAME=hello-0", hello.Spec.Ref, id)
		require.NoError(t, err)
		t.Cleanup(func() { c.removeContainer(id) })
		// hello's client mode retries for up to a minute while the server comes up.
		out, err := c.run(ctx, "run", "--rm", "--with-ns", netns, hello.Spec.Ref, containerID(t, "hello-get"),
			"/hello", "get", "http://127.0.0.1:8080/")
		if err != nil {
			log, _ := os.ReadFile(logPath)
			require.NoError(t, err, "hello's task is %q; its log:\n%s", c.taskStatus(id), log)
		}
		assert.Contains(t, out, "http://127.0.0.1:8080/: hello from hello-0\n")
	})

	t.Run("pause blocks until SIGTERM", func(t *testing.T) {
		id := containerID(t, "pause")
		_, err := c.run(ctx, "run", "-d", defaultPauseRef(t), id)
		require.NoError(t, err)
		t.Cleanup(func() { c.removeContainer(id) })
		require.Eventually(t, func() bool { return c.taskStatus(id) == "RUNNING" }, 10*time.Second, 50*time.Millisecond)
		time.Sleep(time.Second)
		assert.Equal(t, "RUNNING", c.taskStatus(id), "pause keeps running")
		_, err = c.run(ctx, "task", "kill", "--signal", "SIGTERM", id)
		require.NoError(t, err)
		assert.Eventually(t, func() bool { return c.taskStatus(id) == "STOPPED" }, 10*time.Second, 50*time.Millisecond)
	})

	t.Run("services image holds the binaries", func(t *testing.T) {
		out, err := c.run(ctx, "run", "--rm", services.Spec.Ref, containerID(t, "services"), "/usr/local/bin/pause", "-v")
		require.NoError(t, err)
		assert.Equal(t, "pause.go "+defaultRelease(t).Pause+"\n", out)
	})

	t.Run("nft of the kube-proxy image in a network namespace", func(t *testing.T) {
		// kube-proxy runs in its node's network namespace (hostNetwork); here a namespace held by
		// a sleeping process stands for the node's. Two containers join it: one loads a ruleset,
		// the other lists it.
		netns := netNamespace(t)
		nft := func(args ...string) (string, error) {
			return c.run(ctx, append([]string{"run", "--rm", "--privileged", "--with-ns", netns,
				proxy.Spec.Ref, containerID(t, "nft"), "/usr/sbin/nft"}, args...)...)
		}
		_, err := nft("-f", "/rules.nft")
		require.NoError(t, err)
		out, err := nft("list", "table", "inet", "kube-proxy")
		require.NoError(t, err)
		assert.Contains(t, out, "ip daddr . meta l4proto . th dport vmap @service-ips")
		assert.Contains(t, out, "10.96.0.10 . tcp . 53 : goto service-test")
		assert.Contains(t, out, "type nat hook prerouting priority dstnat")
	})
}

func TestImportFailures(t *testing.T) {
	ctx := context.Background()
	c := startContainerd(t)
	garbage := writeInput(t, t.TempDir(), "garbage.tar", "not a tar", 0o644)
	good, err := Build(Pause(buildStatic(t, "../../cmd/pause"), defaultRelease(t)).Spec, filepath.Join(t.TempDir(), "pause.tar"))
	require.NoError(t, err)

	err = Import(ctx, c.ctr, c.socket, "k8s.io", good.File, garbage)
	require.Error(t, err)
	assert.Contains(t, err.Error(), garbage)
	assert.NotContains(t, err.Error(), good.File, "only the failed archive is named")
	assert.NotNil(t, c.criImage(t, defaultPauseRef(t)), "the good archive is imported")

	err = Import(ctx, c.ctr, filepath.Join(t.TempDir(), "none.sock"), "k8s.io", good.File)
	assert.Error(t, err, "no containerd")
}

// defaultRelease is the release of the default Kubernetes version.
func defaultRelease(t *testing.T) kubeversion.Release {
	t.Helper()
	r, err := kubeversion.Lookup(kubeversion.Default)
	require.NoError(t, err)
	return r
}

func defaultPauseRef(t *testing.T) string { return PauseRef(defaultRelease(t)) }

// TestImportControlPlane imports, per supported Kubernetes version, the images `make images`
// built that a node of the version imports (the catalog with the real binaries, and ours) into
// a containerd on tmpfs, as a node does at boot, and checks that the CRI finds each under the
// ref kubeadm uses and that the binaries in them are the version's. It logs what a node pays:
// the archives' size, the import time and the tmpfs the content takes.
func TestImportControlPlane(t *testing.T) {
	dir := imagesDir(t)
	idx, err := ReadIndex(dir)
	require.NoError(t, err)
	for _, e := range idx.Images {
		require.Equal(t, e.SHA256, fileSHA(t, filepath.Join(dir, e.File)), "%s matches the index (run make images)", e.File)
	}
	for _, r := range kubeversion.Releases() {
		t.Run(r.Kubernetes, func(t *testing.T) {
			node, err := idx.ForKubernetes(r.Kubernetes)
			require.NoError(t, err)
			c := startContainerd(t)
			start := time.Now()
			require.NoError(t, Import(context.Background(), c.ctr, c.socket, "k8s.io", node.Files(dir)...))
			var size int64
			for _, e := range node.Images {
				size += e.Size
			}
			t.Logf("imported %d images (%.0f MB) in %v; containerd's tmpfs holds %.0f MB", len(node.Images), float64(size)/1e6,
				time.Since(start).Round(time.Millisecond), float64(c.memUsed(t))/1e6)
			for _, ref := range ReleaseRefs(r) {
				assert.NotNil(t, c.criImage(t, ref), "CRI knows %s", ref)
			}
			assertVersions(t, c, r)
		})
	}
}

// assertVersions runs the binaries inside a release's images (static, on PATH) and checks that
// each reports the release's version.
func assertVersions(t *testing.T, c *containerd, r kubeversion.Release) {
	t.Helper()
	for _, run := range []struct {
		ref  string
		args []string
		want string
	}{
		{KubeRef("kube-apiserver", r.Kubernetes), []string{"kube-apiserver", "--version"}, "Kubernetes " + r.Kubernetes},
		{KubeRef("kube-controller-manager", r.Kubernetes), []string{"kube-controller-manager", "--version"}, "Kubernetes " + r.Kubernetes},
		{KubeRef("kube-scheduler", r.Kubernetes), []string{"kube-scheduler", "--version"}, "Kubernetes " + r.Kubernetes},
		{KubeRef("kube-proxy", r.Kubernetes), []string{"kube-proxy", "--version"}, "Kubernetes " + r.Kubernetes},
		{EtcdRef(r), []string{"etcd", "--version"}, "etcd Version: " + strings.TrimPrefix(r.Etcd, "v")},
		{EtcdRef(r), []string{"etcdctl", "version"}, "etcdctl version: " + strings.TrimPrefix(r.Etcd, "v")},
		{CoreDNSRef(r), []string{"/coredns", "-version"}, "CoreDNS-" + strings.TrimPrefix(r.CoreDNS, "v")},
	} {
		out, err := c.run(context.Background(), append([]string{"run", "--rm", run.ref, containerID(t, "version")}, run.args...)...)
		require.NoError(t, err, "%s %v", run.ref, run.args)
		first := strings.SplitN(strings.TrimSpace(out), "\n", 2)[0]
		assert.Equal(t, run.want, first, "%s %s", run.ref, run.args[0])
	}
}

// TestKubeadmImages: the images of each release are exactly those the release's built kubeadm
// lists (`kubeadm config images list`), so kubeversion's table agrees with kubeadm's constants.
func TestKubeadmImages(t *testing.T) {
	testtier.Integration(t, "the kubeadm of make kube")
	for _, r := range kubeversion.Releases() {
		t.Run(r.Kubernetes, func(t *testing.T) {
			kubeadm := filepath.Join(repoDir(t), "_output", "kube", r.Kubernetes, "bin", "kubeadm")
			out, err := exec.Command(kubeadm, "config", "images", "list", "--kubernetes-version", r.Kubernetes).CombinedOutput()
			require.NoError(t, err, "%s (make kube builds it): %s", kubeadm, out)
			assert.Equal(t, ReleaseRefs(r), strings.Fields(string(out)))
		})
	}
}

// imagesDir returns _output/images of the repository (built by `make images`).
func imagesDir(t *testing.T) string {
	t.Helper()
	testtier.Integration(t, "the images of make images")
	return filepath.Join(repoDir(t), "_output", "images")
}

// repoDir returns the repository the working directory is in.
func repoDir(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	require.NoError(t, err)
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "hack", "build-images.sh")); err == nil {
			return dir
		}
		require.NotEqual(t, dir, filepath.Dir(dir), "no repository above %s", wd)
	}
}

// TestImportLoadedImage: an image a user loads (internal/imageload: read, checked, stored
// under its own name) is imported into a running containerd through its mount namespace, as
// the local provider imports it into a running node, and the CRI finds it under that name.
func TestImportLoadedImage(t *testing.T) {
	ctx := context.Background()
	c := startContainerd(t)
	pause, err := Build(Pause(buildStatic(t, "../../cmd/pause"), defaultRelease(t)).Spec, filepath.Join(t.TempDir(), "pause.tar"))
	require.NoError(t, err)
	img, err := tarball.ImageFromPath(pause.File, nil)
	require.NoError(t, err)
	tag, err := name.NewTag("example.com/team/app:v1")
	require.NoError(t, err)
	userArchive := filepath.Join(t.TempDir(), "app.tar")
	require.NoError(t, tarball.WriteToFile(userArchive, tag, img)) // what `docker save` gives

	images, err := imageload.Read([]string{userArchive}, imageload.NodePlatform)
	require.NoError(t, err)
	stored, err := imageload.Store(filepath.Join(t.TempDir(), "loaded-images"), images)
	require.NoError(t, err)
	require.NoError(t, ImportInMountNamespace(ctx, c.pid, c.ctr, c.socket, "k8s.io", stored...))
	got := c.criImage(t, "example.com/team/app:v1")
	require.NotNil(t, got, "the CRI finds the loaded image by its name")
	assert.True(t, c.unpacked(t)["example.com/team/app:v1"], "unpacked for the snapshotter")

	err = ImportInMountNamespace(ctx, 1<<22, c.ctr, c.socket, "k8s.io", stored...)
	assert.ErrorContains(t, err, "containerd socket of process")
}
