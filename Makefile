# Constellation build entry points. `make help` lists them.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/_output/bin
export PATH := $(BIN):$(PATH)
# Fuzz time per target in `make test` (CI smoke run: 45 targets, each also builds and replays its
# corpus); longer runs: `make fuzz FUZZTIME=5m`.
FUZZTIME ?= 5s
PROTOS := $(shell find api pkg/api -name '*.proto')

.PHONY: help deps debs devtools kube image-bins images vm-image vm-e2e build release-key release test unit integration e2e conformance fuzz lint consumer proto proto-check bench up down clean

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: debs devtools ## install missing Debian packages and pinned Go tools

# What building needs (make up) is the Debian packages; the Go tools are for lint, proto and bench.
debs: ## install missing Debian packages
	@./hack/install-deps.sh debs

devtools: ## build the pinned Go tools (staticcheck, protoc plugins, benchstat) into _output/bin
	@./hack/install-deps.sh devtools

kube: debs ## build every supported Kubernetes version (v1.34.4, v1.35.4; KUBE_VERSIONS narrows it: a list of versions, default, built; hack/kubeversions) and its etcd from the Go module proxy into _output/kube/<version>/bin (once; ~8 CPU-minutes per version cold)
	@./hack/build-kube.sh

images: debs kube ## build the node images (Kubernetes, etcd, pause, CoreDNS, ours) into _output/images
	@./hack/build-images.sh

# Built for the e2e tier's QEMU machine. Root (mmdebstrap, chroot); the Debian tree and the initrd are cached
# in _output/vm-image-cache. VM_IMAGE_DEBUG=1 builds the debug image into _output/vm-image-debug.
# The image runs one Kubernetes version (KUBERNETES, or the default): only it is built.
vm-image: export KUBE_VERSIONS = $(or $(KUBERNETES),default)
vm-image: debs build images ## build the node OS image (UKI, dm-verity erofs root, GPT disk) from the Debian packages pinned in hack/vm-image/packages.lock into _output/vm-image (docs/vm-image.md)
	@./hack/vm-image.sh

# After build: both compile our packages with the same flags, one after the other, so only once.
image-bins: debs build ## build the images' binaries that are not Kubernetes' (CoreDNS, local-path-provisioner, the CSI sidecars, ours)
	@./hack/build-images.sh bins

# Static and -trimpath, as hack/build-images.sh builds the services for the images: both then
# compile our packages once. None of our commands needs cgo.
build: debs ## build the binaries into _output/bin
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/...

release-key: build ## make the local release key once: _output/release-key.pem (private) and .pub (pinned by configs)
	@if [ -f _output/release-key.pem ]; then echo "release key: _output/release-key.pem exists"; else $(BIN)/release keygen _output/release-key.pem; fi

# A release builds the Kubernetes of its image only (KUBERNETES, or the default version) and
# keeps the images of the versions built before (hack/kubeversions "built"): the cluster it
# upgrades runs one of them, and its nodes import them from the same image index.
release: export KUBE_VERSIONS = $(or $(KUBERNETES),default),built
release: build images release-key ## make release VERSION FROM (the running release, or _output/mini/image for make up's cluster; KUBERNETES=v1.35.4 for the next minor; CLOUD_IMAGES=azure=REF@sha256:HEX names its cloud images) into _output/releases/VERSION, signed; builds only its Kubernetes version
	@if [ -z "$(VERSION)" ]; then echo "make release: set VERSION and FROM, e.g. make release VERSION=v0.2.0 FROM=v0.1.0 (docs/upgrades.md)" >&2; exit 1; fi
	@KUBERNETES=$(KUBERNETES) CLOUD_IMAGES="$(CLOUD_IMAGES)" ./hack/release.sh $(VERSION) $(FROM)

test: deps proto-check lint consumer unit integration e2e fuzz ## install what is needed, then run every test tier (CI runs this)
	@echo "make test: all checks passed"

# The test tiers (README.md "Tests"). unit needs Go and nothing built: no root, no _output.
unit: ## unit tier: go test -short, no root, no Kubernetes build (seconds to a minute)
	$(GO) test -short -count=1 ./...
	cd pkg && $(GO) test -short -count=1 ./...

# Every package but test/e2e, without -short: the tests the unit tier skips run here (real
# swtpm, gocryptfs, cryptsetup, containerd, etcd and kube-apiserver; internal/nodeimage
# imports the built images). 30 minutes per test binary, as before the tiers were split.
integration: deps kube images ## integration tier: real swtpm, kube-apiserver + etcd, containerd (root)
	$(GO) test -count=1 -timeout 30m $$($(GO) list ./... | grep -v '/test/e2e')
	cd pkg && $(GO) test -count=1 -timeout 30m ./...

# The end-to-end tests create clusters one after the other in one test binary, and together
# take longer than go test's default 10 minutes per package. One of them boots a QEMU machine
# from the node OS image (TestQEMUMachine, 15 to 25 minutes under TCG). hack/e2e.sh prints each
# test's duration and keeps the whole output in _output/e2e/test.log.
# Its image is built from today's packages if Debian's mirror no longer has a pinned version
# (hack/vm-image.sh resolve_stale_lock): a Debian update must not fail the tests.
e2e: export VM_IMAGE_STALE_LOCK = resolve
e2e: deps kube images vm-image ## end-to-end tier: test/e2e, local clusters from the built binaries and images, one QEMU machine (root)
	@./hack/e2e.sh 75m

# The slower tier of the QEMU provider, run before a stop (not in make test): a cluster of
# machines, one control plane and one worker, under TCG (test/e2e/qemu_cluster_test.go).
vm-e2e: export VM_IMAGE_STALE_LOCK = resolve
vm-e2e: deps kube images vm-image ## QEMU tier: a 1+1 cluster of machines joins, verifies, reboots a worker, stops, starts and recovers (root; about 30 minutes under TCG)
	$(GO) test -count=1 -timeout 60m -tags vme2e -run 'TestQEMUCluster$$' -v ./test/e2e/

fuzz: deps ## run every fuzz target briefly (FUZZTIME per target)
	@./hack/fuzz.sh $(FUZZTIME)

lint: devtools ## gofmt, go vet, staticcheck, go mod tidy check, citations only of what is in the repo
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags vme2e ./test/e2e/
	$(GO) vet -tags azuree2e ./test/azuree2e/
	cd pkg && $(GO) vet ./...
	$(BIN)/staticcheck ./...
	cd pkg && $(BIN)/staticcheck ./...
	@./hack/check-tidy.sh
	@./hack/check-citations.sh

consumer: deps ## build and test a separate module against pkg/ as published through a module proxy (hack/check-consumer.sh)
	@./hack/check-consumer.sh

proto: debs devtools ## regenerate the protobuf/gRPC code under api/
	@for p in $(PROTOS); do protoc -I . --go_out=. --go_opt=paths=source_relative \
	  --go-grpc_out=. --go-grpc_opt=paths=source_relative "$$p"; done

proto-check: debs devtools ## fail if the committed generated code is stale
	@./hack/check-proto.sh

bench: deps kube images ## run the benchmarks and print a table (see docs/benchmarks.md)
	@./hack/bench.sh

# `make up` builds and images the default Kubernetes version only (hack/kubeversions); the tests
# build every supported one. Our binaries, CoreDNS and local-path-provisioner build beside
# etcd and Kubernetes (-j2: image-bins after build): a go build alone does not keep both cores
# busy all the time (loading packages, packages waiting on others, links); the other fills them.
up: export KUBE_VERSIONS = default
up: debs ## create a local confidential cluster: one control plane, two workers (see README)
	@$(MAKE) --no-print-directory -j2 kube image-bins
	@$(MAKE) --no-print-directory images
	$(BIN)/constellation mini up --workspace $(CURDIR)/_output

# The conformance suite against the cluster of `make up` (created if none answers; it stays).
conformance: export KUBE_VERSIONS = default
conformance: debs ## run the Kubernetes conformance suite against the local cluster (docs/conformance.md)
	@$(MAKE) --no-print-directory -j2 kube image-bins
	@$(MAKE) --no-print-directory images
	@./hack/conformance.sh

down: ## remove what `make up` created
	@if [ -x $(BIN)/constellation ]; then $(BIN)/constellation mini down --workspace $(CURDIR)/_output; else rm -rf $(CURDIR)/_output/mini; fi

clean: down ## remove build outputs (keeps nothing under _output)
	rm -rf _output
