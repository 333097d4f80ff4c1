package conformance

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/nodeimage"
)

func TestImages(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o755))
		return p
	}
	in := Inputs{
		Agnhost: file("agnhost", "agnhost"), SampleAPIServer: file("sample-apiserver", "s"), Etcd: file("etcd", "e"), NNP: file("nnp", "n"),
		PorterCert: file("localhost.crt", "cert"), PorterKey: file("localhost.key", "key"), TestImages: filepath.Join(dir, "test-images"),
		Busybox: file("busybox", "#!/bin/sh\necho bin/sh\necho usr/bin/nc\necho usr/bin/wget\necho sbin/sysctl\necho bin/ls\n"),
		Curl:    file("curl", "c"), Dig: file("dig", "d"), Getent: file("getent", "g"), Netcat: file("nc", "n"), Bash: file("bash", "sh"),
		Libraries: func(program string) ([]string, error) {
			if program == filepath.Join(dir, "curl") {
				return []string{filepath.Join(dir, "libcurl.so.4")}, nil
			}
			return nil, nil
		},
		Scratch: filepath.Join(dir, "files"),
	}
	file("libcurl.so.4", "lib")
	for _, n := range []string{"kitten", "nautilus"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "test-images", n, "html"), 0o755))
		file(filepath.Join("test-images", n, "html", "data.json"), `{"image": "`+n+`.jpg"}`)
		file(filepath.Join("test-images", n, "html", n+".jpg"), "jpg")
	}
	var listed []string
	for _, r := range []string{"busybox:1.37.0-1", "agnhost:2.56", "jessie-dnsutils:1.7", "httpd:2.4.38-4", "httpd:2.4.39-4",
		"nginx:1.14-4", "nginx:1.15-4", "nonewprivs:1.3", "nonroot:1.4", "sample-apiserver:1.29.2", "kitten:1.7", "nautilus:1.7", "perl:5.26"} {
		listed = append(listed, Registry+"/e2e-test-images/"+r)
	}
	listed = append(listed, Registry+"/etcd:3.6.4-0", "registry.k8s.io/pause:3.10.1", "gcr.io/k8s-authenticated-test/agnhost:2.6")
	images, err := Images(in, listed)
	require.NoError(t, err)
	assert.Len(t, images, 13, "one per listed tag it builds: not perl, not what is outside the registry")
	byRef := map[string]nodeimage.Spec{}
	for _, img := range images {
		byRef[img.Spec.Ref] = img.Spec
	}
	for _, ref := range []string{"busybox:1.37.0-1", "agnhost:2.56", "jessie-dnsutils:1.7", "httpd:2.4.38-4", "httpd:2.4.39-4",
		"nginx:1.14-4", "nginx:1.15-4", "nonewprivs:1.3", "nonroot:1.4", "sample-apiserver:1.29.2", "kitten:1.7", "nautilus:1.7"} {
		assert.Contains(t, byRef, Registry+"/e2e-test-images/"+ref)
	}
	assert.Contains(t, byRef, Registry+"/etcd:3.6.4-0")

	files := func(s nodeimage.Spec) map[string]nodeimage.File {
		m := map[string]nodeimage.File{}
		for _, f := range s.Files {
			m[f.Path] = f
		}
		return m
	}
	links := func(s nodeimage.Spec) map[string]string {
		m := map[string]string{}
		for _, l := range s.Links {
			m[l.Path] = l.Target
		}
		return m
	}
	agnhost := byRef[Registry+"/e2e-test-images/agnhost:2.56"]
	af := files(agnhost)
	assert.Equal(t, in.Netcat, af["/usr/bin/nc"].Src, "OpenBSD netcat, not busybox's applet")
	assert.Equal(t, in.Bash, af["/bin/bash"].Src)
	assert.Equal(t, "/bin/busybox", links(agnhost)["/bin/sh"], "busybox's ash, as upstream's images")
	assert.Equal(t, "/agnhost", links(agnhost)["/agnhost-2"])
	assert.Equal(t, in.Getent, af["/usr/bin/getent"].Src, "the DNS tests' probes run getent in agnhost too")
	assert.Equal(t, in.PorterCert, af["/localhost.crt"].Src, "porter and netexec serve TLS with it")
	assert.Contains(t, agnhost.Dirs, "/uploads")
	assert.Contains(t, af, filepath.Join(dir, "libcurl.so.4"), "curl's libraries")
	assert.NotContains(t, links(agnhost), "/usr/bin/nc")
	assert.Equal(t, "/bin/busybox", links(agnhost)["/usr/bin/wget"])
	assert.Equal(t, []string{"/agnhost"}, agnhost.Entrypoint)

	httpd := byRef[Registry+"/e2e-test-images/httpd:2.4.38-4"]
	assert.Contains(t, files(httpd), "/usr/local/apache2/htdocs/index.html", "the StatefulSet tests move it to break readiness")
	assert.Equal(t, []string{"httpd", "-f", "-p", "80", "-h", "/usr/local/apache2/htdocs"}, httpd.Cmd)

	kitten := byRef[Registry+"/e2e-test-images/kitten:1.7"]
	assert.Equal(t, filepath.Join(dir, "test-images", "kitten", "html", "data.json"), files(kitten)["/data.json"].Src, "the Update Demo test reads it")
	assert.Equal(t, []string{"test-webserver"}, kitten.Cmd)
	assert.Equal(t, in.Agnhost, files(kitten)["/agnhost"].Src)

	box := byRef[Registry+"/e2e-test-images/busybox:1.37.0-1"]
	assert.Equal(t, "/bin/busybox", links(box)["/bin/sh"])
	assert.NotContains(t, files(box), "/bin/bash", "no bash in the busybox image")
	assert.Equal(t, "/bin/busybox", links(box)["/bin/sysctl"], "every applet in /bin too, as upstream's image")
	assert.Equal(t, "/bin/busybox", links(box)["/sbin/sysctl"])
	assert.Equal(t, "/bin/busybox", links(box)["/bin/ls"])
	assert.Equal(t, int64(0o4755), files(byRef[Registry+"/e2e-test-images/nonewprivs:1.3"])["/usr/local/bin/nnp"].Mode)
	assert.Equal(t, "1234", byRef[Registry+"/e2e-test-images/nonroot:1.4"].User)

	// A list without one of the images it builds is not the suite's list with the override.
	_, err = Images(in, listed[:3])
	assert.ErrorContains(t, err, "names no")

	// Every spec builds.
	for _, img := range images {
		_, err := nodeimage.Build(img.Spec, filepath.Join(t.TempDir(), "x.tar"))
		require.NoError(t, err, img.Spec.Ref)
	}
}

func TestImagesNeedBusybox(t *testing.T) {
	_, err := Images(Inputs{Busybox: filepath.Join(t.TempDir(), "none"), Scratch: t.TempDir()}, nil)
	assert.ErrorContains(t, err, "build-conformance")
}

func TestRepoList(t *testing.T) {
	assert.Equal(t, "promoterE2eRegistry: "+Registry+"/e2e-test-images\ngcEtcdRegistry: "+Registry+"\n", string(RepoList()))
}

func TestELFLibraries(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	// The test binary: static or not, the answer must resolve (no error) and name only files.
	libs, err := ELFLibraries(exe)
	require.NoError(t, err)
	for _, l := range libs {
		assert.FileExists(t, l)
	}
	_, err = ELFLibraries(filepath.Join(t.TempDir(), "none"))
	assert.Error(t, err)
}
