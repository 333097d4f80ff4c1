// Command conformance prepares and reports runs of the Kubernetes conformance suite
// (hack/conformance.sh, internal/conformance):
//
//	conformance images -dir DIR -etcd FILE    the suite's images into DIR/images, the override
//	                                          into DIR/repo-list.yaml, the skips into DIR/skip.regex
//	conformance summary -junit FILE -out FILE the summary of a run's JUnit report
//	conformance smoke-focus                   the focus expression of CI's smoke subset
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/openconstellation/constellation/internal/conformance"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/nodeimage"
)

func main() {
	log.SetFlags(0)
	if len(os.Args) < 2 {
		log.Fatal("usage: conformance images|summary [flags]")
	}
	var err error
	switch os.Args[1] {
	case "images":
		err = images(os.Args[2:])
	case "summary":
		err = summary(os.Args[2:])
	case "smoke-focus":
		fmt.Println(conformance.SmokeFocus())
	default:
		err = fmt.Errorf("unknown command %q: want images, summary or smoke-focus", os.Args[1])
	}
	if err != nil {
		log.Fatalf("conformance: %v", err)
	}
}

func images(args []string) error {
	fs := flag.NewFlagSet("images", flag.ExitOnError)
	dir := fs.String("dir", "", "build output of hack/build-conformance.sh for one Kubernetes version")
	etcd := fs.String("etcd", "", "the cluster's etcd binary")
	_ = fs.Parse(args)
	if *dir == "" || *etcd == "" {
		return fmt.Errorf("images: -dir and -etcd are required")
	}
	repoList := filepath.Join(*dir, "repo-list.yaml")
	if err := fileutil.WriteAtomic(repoList, conformance.RepoList(), 0o644); err != nil {
		return err
	}
	listed, err := conformance.ListedImages(filepath.Join(*dir, "e2e.test"), repoList)
	if err != nil {
		return err
	}
	imgs, err := conformance.Images(conformance.DefaultInputs(*dir, *etcd), listed)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		name := strings.NewReplacer("/", "_", ":", "_").Replace(strings.TrimPrefix(img.Spec.Ref, conformance.Registry+"/"))
		res, err := nodeimage.Build(img.Spec, filepath.Join(*dir, "images", name+".tar"))
		if err != nil {
			return err
		}
		state := "built"
		if res.Cached {
			state = "up to date"
		}
		fmt.Printf("conformance: %s %s (%d MB)\n", state, res.Ref, res.Size>>20)
	}
	return fileutil.WriteAtomic(filepath.Join(*dir, "skip.regex"), []byte(conformance.SkipRegex()+"\n"), 0o644)
}

func summary(args []string) error {
	fs := flag.NewFlagSet("summary", flag.ExitOnError)
	junit := fs.String("junit", "", "JUnit report of the run")
	out := fs.String("out", "", "where to write the summary (also printed)")
	_ = fs.Parse(args)
	f, err := os.Open(*junit)
	if err != nil {
		return err
	}
	defer f.Close()
	s, err := conformance.Summarize(f)
	if err != nil {
		return fmt.Errorf("%s: %w", *junit, err)
	}
	text := s.String()
	fmt.Print(text)
	if *out != "" {
		return fileutil.WriteAtomic(*out, []byte(text), 0o644)
	}
	return nil
}
