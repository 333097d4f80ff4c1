// Command images builds the node images of the local provider into a directory (docker archives
// and index.json; see internal/nodeimage): those of every supported Kubernetes version
// (internal/kubeversion) and ours. hack/build-images.sh builds its inputs and runs it.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/nodeimage"
)

func main() {
	var b nodeimage.Binaries
	out := flag.String("out", "_output/images", "directory of the archives and index.json")
	kubeDir := flag.String("kube-dir", "_output/kube", "directory of <version>/bin per Kubernetes version: its binaries, etcd and etcdctl")
	corednsDir := flag.String("coredns-dir", "_output/images/bin", "directory of coredns-<version> per CoreDNS version")
	flag.StringVar(&b.Pause, "pause", "", "static pause binary")
	flag.StringVar(&b.NFT, "nft", "/usr/sbin/nft", "nft binary for the kube-proxy image")
	hello := flag.String("hello", "", "static binary of test/e2e/hello (optional)")
	services := flag.String("services", "", "comma-separated static binaries of the services image (optional)")
	versions := flag.String("versions", "", "comma-separated Kubernetes versions to image (default: every supported one)")
	flag.Parse()
	log.SetFlags(0)

	releases := kubeversion.Releases()
	if *versions != "" {
		releases = nil
		for _, v := range strings.Split(*versions, ",") {
			r, err := kubeversion.Lookup(v)
			if err != nil {
				log.Fatalf("images: -versions: %v", err)
			}
			releases = append(releases, r)
		}
	}
	b.Kube, b.CoreDNS = map[string]string{}, map[string]string{}
	for _, r := range releases {
		b.Kube[r.Kubernetes] = filepath.Join(*kubeDir, r.Kubernetes, "bin")
		b.CoreDNS[r.CoreDNS] = filepath.Join(*corednsDir, "coredns-"+r.CoreDNS)
	}
	images, err := nodeimage.Catalog(b, releases...)
	if err != nil {
		log.Fatalf("images: %v", err)
	}
	if *services != "" {
		img, err := nodeimage.Services(strings.Split(*services, ",")...)
		if err != nil {
			log.Fatalf("images: %v", err)
		}
		images = append(images, img)
	}
	if *hello != "" {
		img, err := nodeimage.Hello(*hello)
		if err != nil {
			log.Fatalf("images: %v", err)
		}
		images = append(images, img)
	}
	start := time.Now()
	_, results, err := nodeimage.BuildAll(*out, images)
	if err != nil {
		log.Fatalf("images: %v", err)
	}
	built := 0
	for _, r := range results {
		state := "cached"
		if !r.Cached {
			state = "built"
			built++
		}
		fmt.Fprintf(os.Stderr, "  %-7s %6.1f MB  %s\n", state, float64(r.Size)/1e6, r.Ref)
	}
	fmt.Fprintf(os.Stderr, "images: %d built, %d up to date in %s (%.1fs)\n", built, len(results)-built, *out, time.Since(start).Seconds())
}
