package nodeimage

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// buildStatic builds a command of this module as a static binary (as hack/build-images.sh does).
func buildStatic(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "building %s: %s", pkg, out)
	return bin
}

func TestParseLdd(t *testing.T) {
	tests := map[string]struct {
		out     string
		want    []string
		wantErr bool
	}{
		"nft": {
			out: "\tlinux-vdso.so.1 (0x00007ffd)\n" +
				"\tlibnftables.so.1 => /lib/x86_64-linux-gnu/libnftables.so.1 (0x00007f41)\n" +
				"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f41)\n" +
				"\t/lib64/ld-linux-x86-64.so.2 (0x00007f41)\n",
			want: []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libnftables.so.1", "/lib64/ld-linux-x86-64.so.2"},
		},
		"statically linked": {out: "\tstatically linked\n"},
		"missing library": {
			out:     "\tlibfoo.so.1 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n",
			wantErr: true,
		},
		"garbage": {out: "libfoo.so.1 => ???\n", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseLdd([]byte(tc.out))
			if tc.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestWithLibraries(t *testing.T) {
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	files, err := WithLibraries(sh, "/bin/sh")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	assert.Equal(t, File{Src: sh, Path: "/bin/sh"}, files[0])
	var paths []string
	for _, f := range files[1:] {
		assert.Equal(t, f.Src, f.Path, "libraries keep their paths")
		paths = append(paths, filepath.Base(f.Path))
	}
	assert.Contains(t, paths, "libc.so.6")
	assert.Contains(t, strings.Join(paths, " "), "ld-linux", "the loader comes along")

	static := buildStatic(t, "../../cmd/pause")
	files, err = WithLibraries(static, "/pause")
	require.NoError(t, err)
	assert.Equal(t, []File{{Src: static, Path: "/pause"}}, files, "a static binary comes alone")

	_, err = WithLibraries(filepath.Join(t.TempDir(), "none"), "/none")
	assert.Error(t, err)
}

func TestCatalog(t *testing.T) {
	dir := t.TempDir()
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd", "etcdctl", "pause", "coredns"} {
		writeInput(t, dir, b, "binary "+b, 0o755)
	}
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	images, err := Catalog(Binaries{
		KubeDir: dir, Pause: filepath.Join(dir, "pause"), CoreDNS: filepath.Join(dir, "coredns"), NFT: sh,
	})
	require.NoError(t, err)

	// The refs kubeadm v1.34.4 asks for (docs/local-provider.md, "Images").
	want := map[string]string{
		"kube-apiserver":          "registry.k8s.io/kube-apiserver:v1.34.4",
		"kube-controller-manager": "registry.k8s.io/kube-controller-manager:v1.34.4",
		"kube-scheduler":          "registry.k8s.io/kube-scheduler:v1.34.4",
		"kube-proxy":              "registry.k8s.io/kube-proxy:v1.34.4",
		"etcd":                    "registry.k8s.io/etcd:3.6.5-0",
		"pause":                   "registry.k8s.io/pause:3.10.1",
		"coredns":                 "registry.k8s.io/coredns/coredns:v1.12.1",
	}
	got := map[string]string{}
	specs := map[string]Spec{}
	for _, img := range images {
		got[img.Name] = img.Spec.Ref
		specs[img.Name] = img.Spec
	}
	assert.Equal(t, want, got)

	// Where kubeadm's manifests look for the programs.
	paths := func(s Spec) map[string]string {
		m := map[string]string{}
		for _, f := range s.Files {
			m[f.Path] = f.Src
		}
		return m
	}
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd"} {
		assert.Equal(t, filepath.Join(dir, c), paths(specs[c])["/usr/local/bin/"+c], c)
	}
	assert.Equal(t, filepath.Join(dir, "etcdctl"), paths(specs["etcd"])["/usr/local/bin/etcdctl"], "etcdmember runs etcdctl in the etcd pod")
	assert.Contains(t, paths(specs["kube-proxy"]), "/usr/sbin/nft", "kube-proxy's nftables mode runs nft")
	assert.Greater(t, len(specs["kube-proxy"].Files), 2, "nft comes with its libraries")
	assert.Equal(t, []string{"/pause"}, specs["pause"].Entrypoint)
	assert.Equal(t, []string{"/coredns"}, specs["coredns"].Entrypoint)
}

func TestContentTaggedImages(t *testing.T) {
	dir := t.TempDir()
	join := writeInput(t, dir, "joinservice", "join", 0o755)
	key := writeInput(t, dir, "keyservice", "key", 0o755)

	svc, err := Services(join, key)
	require.NoError(t, err)
	assert.Equal(t, ServicesRepo, Repository(svc.Spec.Ref))
	assert.Equal(t, []File{{Src: join, Path: "/usr/local/bin/joinservice"}, {Src: key, Path: "/usr/local/bin/keyservice"}}, svc.Spec.Files)
	require.NoError(t, os.WriteFile(key, []byte("key v2"), 0o755))
	svc2, err := Services(join, key)
	require.NoError(t, err)
	assert.NotEqual(t, svc.Spec.Ref, svc2.Spec.Ref, "a changed binary changes the tag")
	_, err = Services()
	assert.Error(t, err)

	hello, err := Hello(join)
	require.NoError(t, err)
	assert.Equal(t, HelloRepo, Repository(hello.Spec.Ref))
	assert.Equal(t, []string{"/hello"}, hello.Spec.Entrypoint)
}

func TestIndex(t *testing.T) {
	dir := t.TempDir()
	spec := testSpec(t)
	hello, err := Hello(spec.Files[0].Src)
	require.NoError(t, err)
	idx, results, err := BuildAll(dir, []Image{{Name: "app", Spec: spec}, hello})
	require.NoError(t, err)
	require.Len(t, results, 2)

	read, err := ReadIndex(dir)
	require.NoError(t, err)
	assert.Equal(t, idx, read)
	for i, e := range read.Images {
		assert.Equal(t, results[i].Ref, e.Ref)
		assert.Equal(t, fileSHA(t, filepath.Join(dir, e.File)), e.SHA256, "index hash of %s", e.File)
	}
	assert.Equal(t, []string{filepath.Join(dir, "app.tar"), filepath.Join(dir, "hello.tar")}, read.Files(dir))

	e, err := read.Find(HelloRepo)
	require.NoError(t, err)
	assert.Equal(t, hello.Spec.Ref, e.Ref)
	_, err = read.Find(ServicesRepo)
	assert.ErrorIs(t, err, ErrNotInIndex)

	_, _, err = BuildAll(dir, []Image{hello, hello})
	assert.Error(t, err, "two images of one name")

	for name, bad := range map[string]string{
		"escaping file": `{"images":[{"ref":"a/b:c","file":"../x.tar","sha256":"00"}]}`,
		"absolute file": `{"images":[{"ref":"a/b:c","file":"/x.tar","sha256":"00"}]}`,
		"no ref":        `{"images":[{"file":"x.tar","sha256":"00"}]}`,
		"not json":      `[`,
	} {
		t.Run(name, func(t *testing.T) {
			d := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(d, IndexFile), []byte(bad), 0o644))
			_, err := ReadIndex(d)
			assert.Error(t, err)
		})
	}
	_, err = ReadIndex(t.TempDir())
	assert.Error(t, err, "no index")
	var raw map[string][]map[string]any
	data, err := os.ReadFile(filepath.Join(dir, IndexFile))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &raw))
	assert.ElementsMatch(t, []string{"ref", "file", "sha256", "size"}, keys(raw["images"][0]), "index fields")
}

func keys(m map[string]any) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	return k
}

func TestRepository(t *testing.T) {
	for ref, want := range map[string]string{
		"registry.k8s.io/pause:3.10.1":           "registry.k8s.io/pause",
		"localhost/constellation/services:abc":   "localhost/constellation/services",
		"localhost:5000/constellation/hello:abc": "localhost:5000/constellation/hello",
		"localhost:5000/constellation/hello":     "localhost:5000/constellation/hello",
		"busybox":                                "busybox",
	} {
		assert.Equal(t, want, Repository(ref), ref)
	}
}
