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
	"sort"
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
	// Busybox is upstream's, built from source (tools/conformance/busybox): its ash is /bin/sh
	// of every image with a shell, as in upstream's images (the suite compares its messages).
	Busybox string
	// Bash, Curl, Dig (bind9-dnsutils), Getent (libc-bin) and Netcat (netcat-openbsd) are
	// Debian's, with the shared libraries they load (Libraries), for the agnhost and
	// jessie-dnsutils images, as upstream's have them.
	Bash, Curl, Dig, Getent, Netcat string
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
		Busybox:    path.Join(dir, "busybox"), Curl: "/usr/bin/curl", Dig: "/usr/bin/dig", Getent: "/usr/bin/getent",
		Netcat: "/bin/nc.openbsd", Bash: "/bin/bash",
	}
}

// Image is one image of the suite: its reference and what it is made of.
type Image struct {
	Spec nodeimage.Spec
	// Substitutes says, when the image is not the upstream program, what stands in for it.
	Substitutes string
}

// Images returns the images of the suite this repository provides, one per reference of listed
// (the suite's image list, `e2e.test --list-images` with the override: ListedImages) under
// Registry whose name it knows how to build: the suite says which tags it wants. The others
// under Registry are images no conformance test runs (perl, resource-consumer, volume servers
// and the like); it is an error when an image it builds is not listed at all.
func Images(in Inputs, listed []string) ([]Image, error) {
	p, err := newParts(in)
	if err != nil {
		return nil, err
	}
	return fromList(p.builders(), listed)
}

// builder makes the spec of one image for a reference (the suite's tag), and says what stands
// in for upstream's program, if anything.
type builder struct {
	build       func(ref string) (nodeimage.Spec, error)
	substitutes string
}

// parts are what several images share: busybox, the Debian tools with their libraries, and the
// small files written to Inputs.Scratch.
type parts struct {
	in                      Inputs
	box                     box
	dnsTools, netTools      []nodeimage.File
	nsswitch, passwd, group string
}

func newParts(in Inputs) (parts, error) {
	libs := in.Libraries
	if libs == nil {
		libs = ELFLibraries
	}
	p := parts{in: in}
	var err error
	if p.box, err = busybox(in.Busybox); err != nil {
		return parts{}, err
	}
	if p.dnsTools, err = withLibraries(libs, [2]string{in.Bash, "/bin/bash"}, [2]string{in.Dig, "/usr/bin/dig"}, [2]string{in.Getent, "/usr/bin/getent"}); err != nil {
		return parts{}, err
	}
	if p.netTools, err = withLibraries(libs, [2]string{in.Bash, "/bin/bash"}, [2]string{in.Getent, "/usr/bin/getent"}, [2]string{in.Curl, "/usr/bin/curl"}, [2]string{in.Dig, "/usr/bin/dig"}, [2]string{in.Netcat, "/usr/bin/nc"}); err != nil {
		return parts{}, err
	}
	for _, f := range []struct {
		dst           *string
		name, content string
	}{
		{&p.nsswitch, "nsswitch.conf", "hosts: files dns\n"},
		// Upstream's agnhost image has a user and a group of its own (a SupplementalGroups test).
		{&p.passwd, "agnhost-passwd", "root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"},
		{&p.group, "agnhost-group", "root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"},
	} {
		if *f.dst, err = writeFile(in.Scratch, f.name, f.content); err != nil {
			return parts{}, err
		}
	}
	return p, nil
}

// withLibraries is each program (source, path in the image) and the shared libraries it loads,
// each library once.
func withLibraries(libs func(string) ([]string, error), programs ...[2]string) ([]nodeimage.File, error) {
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

// web serves a page naming the image from root with busybox httpd. httpd and nginx serve from
// where upstream's images keep their page: the StatefulSet tests break and mend a pod's
// readiness by moving /usr/local/apache2/htdocs/index.html.
func (p parts) web(root string) func(ref string) (nodeimage.Spec, error) {
	return func(ref string) (nodeimage.Spec, error) {
		index, err := writeFile(p.in.Scratch, path.Base(strings.ReplaceAll(ref, ":", "-"))+".html", "<html><body><h1>"+ref+"</h1></body></html>\n")
		if err != nil {
			return nodeimage.Spec{}, err
		}
		return withBox(p.box, nodeimage.Spec{
			Ref:   ref,
			Files: []nodeimage.File{{Src: index, Path: root + "/index.html"}},
			Cmd:   []string{"httpd", "-f", "-p", "80", "-h", root},
		}), nil
	}
}

func (p parts) agnhost(ref string) (nodeimage.Spec, error) {
	in := p.in
	return withBox(p.box, nodeimage.Spec{
		Ref: ref,
		Files: append([]nodeimage.File{
			{Src: in.Agnhost, Path: "/agnhost"}, {Src: p.nsswitch, Path: "/etc/nsswitch.conf"},
			{Src: in.PorterCert, Path: "/localhost.crt"}, {Src: in.PorterKey, Path: "/localhost.key"},
			{Src: p.passwd, Path: "/etc/passwd"}, {Src: p.group, Path: "/etc/group"},
		}, p.netTools...),
		Dirs: []string{"/uploads"},
		// The suite overrides the entrypoint with /agnhost-2 (Containers tests); a link
		// keeps the name it is run by (argv[0]), which is what the test reads.
		Links:      []nodeimage.Link{{Path: "/agnhost-2", Target: "/agnhost"}},
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"},
	}), nil
}

// webserver is kitten or nautilus: agnhost serving their page and picture (test-webserver), as
// upstream builds them; the kubectl Update Demo test reads data.json.
func (p parts) webserver(name string) func(string) (nodeimage.Spec, error) {
	return func(ref string) (nodeimage.Spec, error) {
		spec, err := p.agnhost(ref)
		for _, f := range []string{"data.json", name + ".jpg"} {
			spec.Files = append(spec.Files, nodeimage.File{Src: path.Join(p.in.TestImages, name, "html", f), Path: "/" + f})
		}
		spec.Cmd = []string{"test-webserver"}
		return spec, err
	}
}

// builders are what this repository builds, by the image's name under the registry; the tags
// are the suite's (its image list, ListedImages).
func (p parts) builders() map[string]builder {
	in, box := p.in, p.box
	return map[string]builder{
		"e2e-test-images/agnhost": {p.agnhost, "upstream's Alpine tools by busybox and Debian's bash, curl, dig, getent and OpenBSD netcat"},
		"e2e-test-images/busybox": {func(ref string) (nodeimage.Spec, error) {
			return withBox(box, nodeimage.Spec{Ref: ref, Cmd: []string{"sh"}}), nil
		}, ""},
		"e2e-test-images/kitten":   {p.webserver("kitten"), "upstream's, on the agnhost image here"},
		"e2e-test-images/nautilus": {p.webserver("nautilus"), "upstream's, on the agnhost image here"},
		"e2e-test-images/httpd":    {p.web("/usr/local/apache2/htdocs"), "busybox httpd serving a static page on port 80"},
		"e2e-test-images/nginx":    {p.web("/usr/share/nginx/html"), "busybox httpd serving a static page on port 80"},
		"e2e-test-images/jessie-dnsutils": {func(ref string) (nodeimage.Spec, error) {
			return withBox(box, nodeimage.Spec{
				Ref:   ref,
				Files: append([]nodeimage.File{{Src: p.nsswitch, Path: "/etc/nsswitch.conf"}}, p.dnsTools...),
				Cmd:   []string{"sh"},
			}), nil
		}, "Debian jessie by busybox with Debian 12's bash, dig and getent"},
		"e2e-test-images/nonewprivs": {func(ref string) (nodeimage.Spec, error) {
			return withBox(box, nodeimage.Spec{
				Ref:        ref,
				Files:      []nodeimage.File{{Src: in.NNP, Path: "/usr/local/bin/nnp", Mode: 0o4755}},
				Entrypoint: []string{"/usr/local/bin/nnp"},
			}), nil
		}, "test/conformance/nnp (Go) for upstream's nnp.c: a set-user-ID program printing its effective UID"},
		"e2e-test-images/nonroot": {func(ref string) (nodeimage.Spec, error) {
			return withBox(box, nodeimage.Spec{Ref: ref, User: "1234", Cmd: []string{"sh", "-c", "sleep 3600"}}), nil
		}, ""},
		"e2e-test-images/sample-apiserver": {binary(in.SampleAPIServer, "/sample-apiserver", true), "k8s.io/sample-apiserver at the version tools/conformance/sample-apiserver pins"},
		"etcd":                             {binary(in.Etcd, "/usr/local/bin/etcd", false), "the cluster's etcd"},
	}
}

// binary is an image of one program at dst, its entrypoint or its command.
func binary(src, dst string, entrypoint bool) func(ref string) (nodeimage.Spec, error) {
	return func(ref string) (nodeimage.Spec, error) {
		spec := nodeimage.Spec{Ref: ref, Files: []nodeimage.File{{Src: src, Path: dst}}}
		if entrypoint {
			spec.Entrypoint = []string{dst}
		} else {
			spec.Cmd = []string{dst}
		}
		return spec, nil
	}
}

// fromList builds one image per listed reference under Registry that a builder knows, and fails
// when a builder's image is not listed at all.
func fromList(builders map[string]builder, listed []string) ([]Image, error) {
	var images []Image
	built := map[string]bool{}
	for _, ref := range listed {
		name, _, ok := strings.Cut(strings.TrimPrefix(ref, Registry+"/"), ":")
		b, known := builders[name]
		if !ok || !strings.HasPrefix(ref, Registry+"/") || !known {
			continue
		}
		spec, err := b.build(ref)
		if err != nil {
			return nil, err
		}
		images = append(images, Image{Spec: spec, Substitutes: b.substitutes})
		built[name] = true
	}
	for name := range builders {
		if !built[name] {
			return nil, fmt.Errorf("the suite's image list names no %s/%s: is it the list of an e2e.test run with the override (RepoList)?", Registry, name)
		}
	}
	sort.Slice(images, func(i, j int) bool { return images[i].Spec.Ref < images[j].Spec.Ref })
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

// box is busybox and the links of its applets.
type box struct {
	files []nodeimage.File
	links []nodeimage.Link
}

// busybox lists the applets of the busybox at bin (busybox --list-full).
func busybox(bin string) (box, error) {
	out, err := exec.Command(bin, "--list-full").Output()
	if err != nil {
		return box{}, fmt.Errorf("listing the applets of %s (hack/build-conformance.sh builds it): %w", bin, err)
	}
	b := box{files: []nodeimage.File{{Src: bin, Path: "/bin/busybox"}}}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		p := "/" + strings.TrimSpace(sc.Text())
		if p == "/" || p == "/bin/busybox" {
			continue
		}
		b.links = append(b.links, nodeimage.Link{Path: p, Target: "/bin/busybox"})
		// Upstream's busybox image has every applet in /bin as well (the suite runs
		// /bin/sysctl), Debian's lists some under /sbin and /usr/bin.
		if bin := "/bin/" + path.Base(p); bin != p && !seen[bin] {
			b.links = append(b.links, nodeimage.Link{Path: bin, Target: "/bin/busybox"})
		}
		seen[p], seen["/bin/"+path.Base(p)] = true, true
	}
	if len(b.links) == 0 {
		return box{}, fmt.Errorf("%s lists no applets", bin)
	}
	return b, nil
}

// withBox adds busybox and its applets to spec, except where spec has a file of its own.
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

// ListedImages runs the suite's e2e.test with the override in repoList and returns the image
// references it lists (--list-images), one per line.
func ListedImages(e2eTest, repoList string) ([]string, error) {
	cmd := exec.Command(e2eTest, "--list-images")
	cmd.Env = append(os.Environ(), "KUBE_TEST_REPO_LIST="+repoList)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing the suite's images (%s --list-images): %w", e2eTest, err)
	}
	var refs []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			refs = append(refs, l)
		}
	}
	return refs, nil
}
