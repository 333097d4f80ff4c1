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

	"github.com/openconstellation/constellation/internal/kubeversion"
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

// catalogInputs writes stand-ins of every input of the catalog of the supported releases:
// per Kubernetes version a directory of its binaries, per CoreDNS version a binary.
func catalogInputs(t *testing.T) Binaries {
	t.Helper()
	dir := t.TempDir()
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	b := Binaries{Kube: map[string]string{}, CoreDNS: map[string]string{}, Pause: writeInput(t, dir, "pause", "pause", 0o755), NFT: sh}
	for _, r := range kubeversion.Releases() {
		kube := filepath.Join(dir, r.Kubernetes)
		require.NoError(t, os.MkdirAll(kube, 0o755))
		for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd", "etcdctl"} {
			writeInput(t, kube, c, c+" "+r.Kubernetes, 0o755)
		}
		b.Kube[r.Kubernetes] = kube
		b.CoreDNS[r.CoreDNS] = writeInput(t, dir, "coredns-"+r.CoreDNS, "coredns "+r.CoreDNS, 0o755)
	}
	return b
}

func TestCatalog(t *testing.T) {
	b := catalogInputs(t)
	v134, err := kubeversion.Lookup("v1.34.4")
	require.NoError(t, err)
	v135, err := kubeversion.Lookup("v1.35.4")
	require.NoError(t, err)
	testCases := map[string]struct {
		releases []kubeversion.Release
		// want maps archive names to refs: what kubeadm of each version asks for
		// (docs/local-provider.md, "Images").
		want map[string]string
	}{
		"v1.34.4": {
			releases: []kubeversion.Release{v134},
			want: map[string]string{
				"kube-apiserver-v1.34.4":          "registry.k8s.io/kube-apiserver:v1.34.4",
				"kube-controller-manager-v1.34.4": "registry.k8s.io/kube-controller-manager:v1.34.4",
				"kube-scheduler-v1.34.4":          "registry.k8s.io/kube-scheduler:v1.34.4",
				"kube-proxy-v1.34.4":              "registry.k8s.io/kube-proxy:v1.34.4",
				"etcd-3.6.5-0":                    "registry.k8s.io/etcd:3.6.5-0",
				"pause-3.10.1":                    "registry.k8s.io/pause:3.10.1",
				"coredns-v1.12.1":                 "registry.k8s.io/coredns/coredns:v1.12.1",
			},
		},
		"both, pause shared": {
			releases: []kubeversion.Release{v134, v135},
			want: map[string]string{
				"kube-apiserver-v1.34.4":          "registry.k8s.io/kube-apiserver:v1.34.4",
				"kube-controller-manager-v1.34.4": "registry.k8s.io/kube-controller-manager:v1.34.4",
				"kube-scheduler-v1.34.4":          "registry.k8s.io/kube-scheduler:v1.34.4",
				"kube-proxy-v1.34.4":              "registry.k8s.io/kube-proxy:v1.34.4",
				"etcd-3.6.5-0":                    "registry.k8s.io/etcd:3.6.5-0",
				"pause-3.10.1":                    "registry.k8s.io/pause:3.10.1",
				"coredns-v1.12.1":                 "registry.k8s.io/coredns/coredns:v1.12.1",
				"kube-apiserver-v1.35.4":          "registry.k8s.io/kube-apiserver:v1.35.4",
				"kube-controller-manager-v1.35.4": "registry.k8s.io/kube-controller-manager:v1.35.4",
				"kube-scheduler-v1.35.4":          "registry.k8s.io/kube-scheduler:v1.35.4",
				"kube-proxy-v1.35.4":              "registry.k8s.io/kube-proxy:v1.35.4",
				"etcd-3.6.6-0":                    "registry.k8s.io/etcd:3.6.6-0",
				"coredns-v1.13.1":                 "registry.k8s.io/coredns/coredns:v1.13.1",
			},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			images, err := Catalog(b, tc.releases...)
			require.NoError(t, err)
			got := map[string]string{}
			specs := map[string]Spec{}
			for _, img := range images {
				got[img.Name] = img.Spec.Ref
				specs[img.Name] = img.Spec
			}
			assert.Equal(t, tc.want, got)
			for _, r := range tc.releases {
				assertReleaseImages(t, b, r, specs)
			}
		})
	}
}

// assertReleaseImages checks where kubeadm's manifests look for the programs of r, and that
// each image has the binaries of r.
func assertReleaseImages(t *testing.T, b Binaries, r kubeversion.Release, specs map[string]Spec) {
	t.Helper()
	paths := func(s Spec) map[string]string {
		m := map[string]string{}
		for _, f := range s.Files {
			m[f.Path] = f.Src
		}
		return m
	}
	kube := b.Kube[r.Kubernetes]
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"} {
		assert.Equal(t, filepath.Join(kube, c), paths(specs[c+"-"+r.Kubernetes])["/usr/local/bin/"+c], c)
	}
	etcd := specs["etcd-"+r.EtcdTag()]
	assert.Equal(t, filepath.Join(kube, "etcd"), paths(etcd)["/usr/local/bin/etcd"])
	assert.Equal(t, filepath.Join(kube, "etcdctl"), paths(etcd)["/usr/local/bin/etcdctl"], "etcdmember runs etcdctl in the etcd pod")
	proxy := specs["kube-proxy-"+r.Kubernetes]
	assert.Contains(t, paths(proxy), "/usr/sbin/nft", "kube-proxy's nftables mode runs nft")
	assert.Greater(t, len(proxy.Files), 2, "nft comes with its libraries")
	assert.Equal(t, []string{"/pause"}, specs["pause-"+r.Pause].Entrypoint)
	coredns := specs["coredns-"+r.CoreDNS]
	assert.Equal(t, []string{"/coredns"}, coredns.Entrypoint)
	assert.Equal(t, b.CoreDNS[r.CoreDNS], paths(coredns)["/coredns"])
}

func TestCatalogMissingInputs(t *testing.T) {
	r, err := kubeversion.Lookup(kubeversion.Default)
	require.NoError(t, err)
	b := catalogInputs(t)
	delete(b.Kube, r.Kubernetes)
	_, err = Catalog(b, r)
	assert.ErrorContains(t, err, "no binaries of Kubernetes "+r.Kubernetes)
	b = catalogInputs(t)
	delete(b.CoreDNS, r.CoreDNS)
	_, err = Catalog(b, r)
	assert.ErrorContains(t, err, "no CoreDNS "+r.CoreDNS)
}

// TestForKubernetes: a node imports its version's images and ours, nothing of another version.
func TestForKubernetes(t *testing.T) {
	var idx Index
	seen := map[string]bool{}
	for _, r := range kubeversion.Releases() {
		for _, ref := range ReleaseRefs(r) {
			if !seen[ref] {
				seen[ref] = true
				idx.Images = append(idx.Images, Entry{Ref: ref, File: ref + ".tar"})
			}
		}
	}
	idx.Images = append(idx.Images, Entry{Ref: ServicesRepo + ":abc", File: "services.tar"}, Entry{Ref: HelloRepo + ":def", File: "hello.tar"})
	refs := func(idx Index) []string {
		var r []string
		for _, e := range idx.Images {
			r = append(r, e.Ref)
		}
		return r
	}
	testCases := map[string]struct {
		versions []string
		want     []string
		wantErr  string
	}{
		"v1.34.4": {versions: []string{"v1.34.4"}, want: []string{
			"registry.k8s.io/kube-apiserver:v1.34.4", "registry.k8s.io/kube-controller-manager:v1.34.4", "registry.k8s.io/kube-scheduler:v1.34.4",
			"registry.k8s.io/kube-proxy:v1.34.4", "registry.k8s.io/coredns/coredns:v1.12.1", "registry.k8s.io/pause:3.10.1", "registry.k8s.io/etcd:3.6.5-0",
			ServicesRepo + ":abc", HelloRepo + ":def",
		}},
		"v1.35.4": {versions: []string{"v1.35.4"}, want: []string{
			"registry.k8s.io/pause:3.10.1",
			"registry.k8s.io/kube-apiserver:v1.35.4", "registry.k8s.io/kube-controller-manager:v1.35.4", "registry.k8s.io/kube-scheduler:v1.35.4",
			"registry.k8s.io/kube-proxy:v1.35.4", "registry.k8s.io/coredns/coredns:v1.13.1", "registry.k8s.io/etcd:3.6.6-0",
			ServicesRepo + ":abc", HelloRepo + ":def",
		}},
		"both":        {versions: []string{"v1.35.4", "v1.34.4"}, want: refs(idx)},
		"unsupported": {versions: []string{"v1.33.0"}, wantErr: `kubernetesVersion "v1.33.0" is not supported (supported: v1.34.4, v1.35.4)`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := idx.ForKubernetes(tc.versions...)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, refs(got))
		})
	}

	t.Run("missing image", func(t *testing.T) {
		partial := Index{Images: idx.Images[1:]}
		_, err := partial.ForKubernetes("v1.34.4")
		assert.ErrorIs(t, err, ErrNotInIndex)
		assert.ErrorContains(t, err, "registry.k8s.io/kube-apiserver:v1.34.4 (run `make images`)")
	})
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

	// Each release's services image has a tag of its own, from the same binaries.
	r1, err := ReleaseServices("v0.1.0", join, key)
	require.NoError(t, err)
	r2, err := ReleaseServices("v0.2.0", join, key)
	require.NoError(t, err)
	again, err := ReleaseServices("v0.1.0", join, key)
	require.NoError(t, err)
	assert.Equal(t, ServicesRepo, Repository(r1.Spec.Ref))
	assert.NotEqual(t, r1.Spec.Ref, r2.Spec.Ref)
	assert.NotEqual(t, svc2.Spec.Ref, r1.Spec.Ref)
	assert.Equal(t, r1.Spec.Ref, again.Spec.Ref, "deterministic")
	assert.Equal(t, []string{"CONSTELLATION_RELEASE=v0.1.0"}, r1.Spec.Env)

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

func TestRepositoryAndTag(t *testing.T) {
	for ref, want := range map[string][2]string{
		"registry.k8s.io/pause:3.10.1":          {"registry.k8s.io/pause", "3.10.1"},
		"localhost:5000/constellation/x:v1":     {"localhost:5000/constellation/x", "v1"},
		"registry.k8s.io/coredns/coredns":       {"registry.k8s.io/coredns/coredns", ""},
		"localhost:5000/constellation/untagged": {"localhost:5000/constellation/untagged", ""},
	} {
		assert.Equal(t, want[0], Repository(ref), ref)
		assert.Equal(t, want[1], Tag(ref), ref)
	}
}
