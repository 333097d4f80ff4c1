// Package conformance prepares a cluster for the Kubernetes conformance suite (e2e.test of the
// cluster's Kubernetes version, hack/conformance.sh) without a registry: the suite's test images,
// built from source or assembled from the build machine's Debian packages, the image-repository
// override (KUBE_TEST_REPO_LIST) that names them, the tests skipped by name with their reasons,
// and the summary of a run's JUnit report.
//
// Why substitutes are faithful enough is written down per image in docs/conformance.md; the
// suite's tests decide: an image that does not do what a test needs makes that test fail.
package conformance

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"strings"

	"github.com/openconstellation/constellation/internal/nodeimage"
)

// Registry is where the override puts the suite's images (PromoterE2eRegistry and
// GcEtcdRegistry of the suite's RegistryList): a name no registry answers, so every one of
// them comes from the nodes' own store.
const Registry = "localhost/constellation/e2e"

// Inputs are the files the images are made of.
type Inputs struct {
	// Agnhost and SampleAPIServer are built from the Kubernetes version's modules; Etcd is the
	// cluster's etcd; NNP is this repository's test/conformance/nnp.
	Agnhost, SampleAPIServer, Etcd, NNP string
	// PorterCert and PorterKey are the TLS certificate and key agnhost's porter and netexec
	// serve (test/images/agnhost/porter of the Kubernetes module), at / in upstream's image.
	PorterCert, PorterKey string
	// TestImages is the Kubernetes module's test/images: kitten's and nautilus' pages.
	TestImages string
	// Busybox (busybox-static), Curl, Dig (bind9-dnsutils), Getent (libc-bin) and Netcat
	// (netcat-openbsd, as upstream's agnhost has) are Debian's, with the shared libraries they
	// load (Libraries).
	Busybox, Curl, Dig, Getent, Netcat string
	// Bash (Debian's) is every image's /bin/sh, for two reasons found by the suite: Debian's
	// busybox-static shell runs its own applet for a name before looking at PATH, so
	// `sh -c "nc -v …"` ran busybox's nc, which lacks the options the suite uses; and both it and
	// dash drop environment variables whose names are no shell identifiers ("data-1"), which
	// Kubernetes allows and the suite checks reach the container (upstream's busybox 1.37 keeps
	// them, as bash does).
	Bash string
	// Libraries resolves a dynamically linked program's shared libraries; nil: ELFLibraries.
	Libraries func(program string) ([]string, error)
	// Scratch is a directory for the small files the images carry (web pages, nsswitch.conf).
	Scratch string
}

// DefaultInputs are the inputs at their usual places: the build output of
// hack/build-conformance.sh in dir, etcd at etcd, Debian's programs where Debian puts them.
func DefaultInputs(dir, etcd string) Inputs {
	return Inputs{
		Scratch: path.Join(dir, "files"),
		Agnhost: path.Join(dir, "agnhost"), SampleAPIServer: path.Join(dir, "sample-apiserver"),
		NNP: path.Join(dir, "nnp"), Etcd: etcd,
		PorterCert: path.Join(dir, "localhost.crt"), PorterKey: path.Join(dir, "localhost.key"),
		TestImages: path.Join(dir, "test-images"),
		Busybox:    "/bin/busybox", Curl: "/usr/bin/curl", Dig: "/usr/bin/dig", Getent: "/usr/bin/getent",
		Netcat: "/bin/nc.openbsd", Bash: "/bin/bash",
	}
}

// Image is one image of the suite: its reference and what it is made of.
type Image struct {
	Spec nodeimage.Spec
	// Substitutes says, when the image is not the upstream program, what stands in for it.
	Substitutes string
}

// Images returns the images of the suite this repository provides, under Registry with the
// names and tags the suite of kubernetesVersion asks for (its test/utils/image manifest).
func Images(in Inputs) ([]Image, error) {
	libs := in.Libraries
	if libs == nil {
		libs = ELFLibraries
	}
	box, err := busybox(in.Busybox)
	if err != nil {
		return nil, err
	}
	shell, err := libs(in.Bash)
	if err != nil {
		return nil, err
	}
	box.files = append(box.files, nodeimage.File{Src: in.Bash, Path: "/bin/sh"}, nodeimage.File{Src: in.Bash, Path: "/bin/bash"})
	for _, l := range shell {
		box.files = append(box.files, nodeimage.File{Src: l, Path: l})
	}
	withLibs := func(programs ...[2]string) ([]nodeimage.File, error) {
		var files []nodeimage.File
		seen := map[string]bool{}
		for _, p := range programs {
			files = append(files, nodeimage.File{Src: p[0], Path: p[1]})
			l, err := libs(p[0])
			if err != nil {
				return nil, err
			}
			for _, lib := range l {
				if !seen[lib] {
					seen[lib] = true
					files = append(files, nodeimage.File{Src: lib, Path: lib})
				}
			}
		}
		return files, nil
	}
	dnsTools, err := withLibs([2]string{in.Dig, "/usr/bin/dig"}, [2]string{in.Getent, "/usr/bin/getent"})
	if err != nil {
		return nil, err
	}
	netTools, err := withLibs([2]string{in.Getent, "/usr/bin/getent"}, [2]string{in.Curl, "/usr/bin/curl"}, [2]string{in.Dig, "/usr/bin/dig"}, [2]string{in.Netcat, "/usr/bin/nc"})
	if err != nil {
		return nil, err
	}
	nsswitch, err := writeFile(in.Scratch, "nsswitch.conf", "hosts: files dns\n")
	if err != nil {
		return nil, err
	}
	// Upstream's agnhost image has a user and a group of its own (a SupplementalGroups test).
	passwd, err := writeFile(in.Scratch, "agnhost-passwd", "root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")
	if err != nil {
		return nil, err
	}
	group, err := writeFile(in.Scratch, "agnhost-group", "root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n")
	if err != nil {
		return nil, err
	}
	e2e := func(name string) string { return Registry + "/e2e-test-images/" + name }
	web := func(ref, page string) (Image, error) {
		index, err := writeFile(in.Scratch, path.Base(strings.ReplaceAll(ref, ":", "-"))+".html", page)
		if err != nil {
			return Image{}, err
		}
		return Image{
			Spec: withBox(box, nodeimage.Spec{
				Ref:   ref,
				Files: []nodeimage.File{{Src: index, Path: "/htdocs/index.html"}},
				Cmd:   []string{"httpd", "-f", "-p", "80", "-h", "/htdocs"},
			}),
			Substitutes: "busybox httpd serving a static page on port 80",
		}, nil
	}
	agnhost := func(ref string) nodeimage.Spec {
		return withBox(box, nodeimage.Spec{
			Ref: ref,
			Files: append([]nodeimage.File{
				{Src: in.Agnhost, Path: "/agnhost"}, {Src: nsswitch, Path: "/etc/nsswitch.conf"},
				{Src: in.PorterCert, Path: "/localhost.crt"}, {Src: in.PorterKey, Path: "/localhost.key"},
				{Src: passwd, Path: "/etc/passwd"}, {Src: group, Path: "/etc/group"},
			}, netTools...),
			Dirs: []string{"/uploads"},
			// The suite overrides the entrypoint with /agnhost-2 (Containers tests); a link
			// keeps the name it is run by (argv[0]), which is what the test reads.
			Links:      []nodeimage.Link{{Path: "/agnhost-2", Target: "/agnhost"}},
			Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"},
		})
	}
	// kitten and nautilus are agnhost serving their page and picture (test-webserver), as
	// upstream builds them; the kubectl Update Demo test reads data.json.
	webserver := func(name string) Image {
		spec := agnhost(e2e(name + ":1.7"))
		for _, f := range []string{"data.json", name + ".jpg"} {
			spec.Files = append(spec.Files, nodeimage.File{Src: path.Join(in.TestImages, name, "html", f), Path: "/" + f})
		}
		spec.Cmd = []string{"test-webserver"}
		return Image{Spec: spec, Substitutes: "upstream's, on the agnhost image here"}
	}
	images := []Image{
		{Spec: withBox(box, nodeimage.Spec{Ref: e2e("busybox:1.37.0-1"), Cmd: []string{"sh"}})},
		{Spec: agnhost(e2e("agnhost:2.56")), Substitutes: "upstream's Alpine tools by busybox (ip, nslookup, …) and Debian's bash (sh), curl, dig, getent and OpenBSD netcat"},
		webserver("kitten"),
		webserver("nautilus"),
		{Spec: withBox(box, nodeimage.Spec{
			Ref:   e2e("jessie-dnsutils:1.7"),
			Files: append([]nodeimage.File{{Src: nsswitch, Path: "/etc/nsswitch.conf"}}, dnsTools...),
			Cmd:   []string{"sh"},
		}), Substitutes: "Debian jessie by busybox with Debian 12's bash (sh), dig and getent"},
		{Spec: withBox(box, nodeimage.Spec{
			Ref:        e2e("nonewprivs:1.3"),
			Files:      []nodeimage.File{{Src: in.NNP, Path: "/usr/local/bin/nnp", Mode: 0o4755}},
			Entrypoint: []string{"/usr/local/bin/nnp"},
		}), Substitutes: "test/conformance/nnp (Go) for upstream's nnp.c: a set-user-ID program printing its effective UID"},
		{Spec: withBox(box, nodeimage.Spec{Ref: e2e("nonroot:1.4"), User: "1234", Cmd: []string{"sh", "-c", "sleep 3600"}})},
		{Spec: nodeimage.Spec{
			Ref:        e2e("sample-apiserver:1.29.2"),
			Files:      []nodeimage.File{{Src: in.SampleAPIServer, Path: "/sample-apiserver"}},
			Entrypoint: []string{"/sample-apiserver"},
		}, Substitutes: "k8s.io/sample-apiserver of the cluster's Kubernetes version"},
		{Spec: nodeimage.Spec{
			Ref:   Registry + "/etcd:3.6.4-0",
			Files: []nodeimage.File{{Src: in.Etcd, Path: "/usr/local/bin/etcd"}},
			Cmd:   []string{"/usr/local/bin/etcd"},
		}, Substitutes: "the cluster's etcd"},
	}
	for _, w := range []struct{ ref, page string }{
		{e2e("httpd:2.4.38-4"), "<html><body><h1>It works!</h1></body></html>\n"},
		{e2e("httpd:2.4.39-4"), "<html><body><h1>It works!</h1></body></html>\n"},
		{e2e("nginx:1.14-4"), "<html><body><h1>Welcome to nginx!</h1></body></html>\n"},
		{e2e("nginx:1.15-4"), "<html><body><h1>Welcome to nginx!</h1></body></html>\n"},
	} {
		img, err := web(w.ref, w.page)
		if err != nil {
			return nil, err
		}
		images = append(images, img)
	}
	return images, nil
}

// RepoList is the suite's image-repository override (the file KUBE_TEST_REPO_LIST names): the
// registries of the images above point at Registry; the others keep the suite's defaults (the
// pause image is the nodes' own, registry.k8s.io/pause; the private and invalid registries are
// those of tests that need the internet, skipped by name).
func RepoList() []byte {
	return []byte("promoterE2eRegistry: " + Registry + "/e2e-test-images\n" +
		"gcEtcdRegistry: " + Registry + "\n")
}

// box is busybox and the links of its applets, and the shell with its libraries.
type box struct {
	files []nodeimage.File
	links []nodeimage.Link
}

// busybox lists the applets of the busybox at bin (busybox --list-full).
func busybox(bin string) (box, error) {
	out, err := exec.Command(bin, "--list-full").Output()
	if err != nil {
		return box{}, fmt.Errorf("listing the applets of %s (Debian's busybox-static): %w", bin, err)
	}
	b := box{files: []nodeimage.File{{Src: bin, Path: "/bin/busybox"}}}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		p := "/" + strings.TrimSpace(sc.Text())
		if p == "/" || p == "/bin/busybox" || p == "/bin/sh" || p == "/bin/bash" {
			continue
		}
		b.links = append(b.links, nodeimage.Link{Path: p, Target: "/bin/busybox"})
		// Upstream's busybox image has every applet in /bin as well (the suite runs
		// /bin/sysctl), Debian's lists some under /sbin and /usr/bin.
		if bin := "/bin/" + path.Base(p); bin != p && !seen[bin] && bin != "/bin/sh" && bin != "/bin/bash" {
			b.links = append(b.links, nodeimage.Link{Path: bin, Target: "/bin/busybox"})
		}
		seen[p], seen["/bin/"+path.Base(p)] = true, true
	}
	if len(b.links) == 0 {
		return box{}, fmt.Errorf("%s lists no applets", bin)
	}
	return b, nil
}

// withBox adds busybox, its applets and the shell to spec, except where spec has a file of its
// own.
func withBox(b box, spec nodeimage.Spec) nodeimage.Spec {
	own := map[string]bool{}
	for _, f := range spec.Files {
		own[path.Clean(f.Path)] = true
	}
	var files []nodeimage.File
	for _, f := range b.files {
		if !own[f.Path] {
			own[f.Path] = true
			files = append(files, f)
		}
	}
	spec.Files = append(files, spec.Files...)
	for _, l := range b.links {
		if !own[l.Path] {
			spec.Links = append(spec.Links, l)
		}
	}
	return spec
}

// writeFile writes content to name in dir.
func writeFile(dir, name, content string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	p := path.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		return "", err
	}
	return p, nil
}
