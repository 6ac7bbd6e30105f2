# mesh — build, generate, lint and test. Run `make help` for the targets.
SHELL := /bin/bash
BIN := $(CURDIR)/bin
GO ?= go
export PATH := $(BIN):$(PATH)

# The tools are rebuilt only when tools/go.mod or tools/go.sum changed since
# the last build (bin/.tools-stamp records it) or a binary is missing.
TOOLS := buf protoc-gen-go protoc-gen-go-grpc grpcurl nats-server
TOOL_BINS := $(addprefix $(BIN)/,$(TOOLS))

# The binaries `make build` produces.
BINARIES := mesh-catalog mesh-signer mesh-composer mesh-nodeengine meshctl

.PHONY: help tools generate checkgenerate lint breaking build test test-short bench fuzz images clean

help:
	@echo "make tools          build pinned buf, protoc-gen-go(-grpc), grpcurl, nats-server into ./bin"
	@echo "make generate       regenerate the protobuf Go code"
	@echo "make checkgenerate  regenerate and fail on any diff"
	@echo "make lint           go vet, buf lint, buf format"
	@echo "make breaking       buf breaking (WIRE_JSON) against the newest release tag v*, once one exists"
	@echo "make build          build every binary into ./bin"
	@echo "make test           go test mesh.dev/..."
	@echo "make test-short     go test -short mesh.dev/... (no processes, containers or kills)"
	@echo "make bench          every benchmark once, each printing its figure beside its same-run baseline"
	@echo "make images         the FROM scratch container images (deploy/images/build.sh)"
	@echo "make fuzz           run every fuzz target for FUZZTIME each (default 60s)"

$(BIN)/.tools-stamp: tools/go.mod tools/go.sum
	@mkdir -p $(BIN)
	cd tools && GOWORK=off GOBIN=$(BIN) GOFLAGS=-mod=mod $(GO) install tool
	@touch $@

$(TOOL_BINS): $(BIN)/.tools-stamp

tools: $(BIN)/.tools-stamp
	@for t in $(TOOLS); do test -x $(BIN)/$$t || { rm -f $(BIN)/.tools-stamp; $(MAKE) --no-print-directory $(BIN)/.tools-stamp; break; }; done

generate: tools
	$(BIN)/buf format -w
	$(BIN)/buf generate

checkgenerate: generate
	@if [ -n "$$(git status --porcelain -- proto)" ]; then \
		echo "generated code differs from what is committed:"; git status --porcelain -- proto; git diff --stat -- proto; exit 1; \
	fi

lint: tools
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "not gofmt-formatted (run gofmt -w):"; echo "$$unformatted"; exit 1; fi
	$(GO) vet mesh.dev/...
	$(BIN)/buf lint
	$(BIN)/buf format -d --exit-code

# The v1 API may change freely until the first release; from then on every
# change is checked against the newest release tag.
breaking: tools
	@tag=$$(git describe --tags --abbrev=0 --match 'v*' 2>/dev/null || true); \
	if [ -z "$$tag" ]; then echo "buf breaking: no release tag v* yet, nothing to compare against"; \
	else echo "buf breaking against $$tag"; $(BIN)/buf breaking --against ".git#tag=$$tag"; fi

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o $(BIN)/ \
		mesh.dev/services/catalog/cmd/mesh-catalog \
		mesh.dev/services/signer/cmd/mesh-signer \
		mesh.dev/services/composer/cmd/mesh-composer \
		mesh.dev/services/nodeengine/cmd/mesh-nodeengine \
		mesh.dev/cmd/meshctl

test: tools
	$(GO) test -count=1 -timeout 45m mesh.dev/...

test-short: tools
	$(GO) test -count=1 -short mesh.dev/...

# One run of each benchmark; `meshctl bench compose|converge` take flags for
# the full sizes (README.md, Benchmarks).
bench: tools
	$(GO) test -run '^$$' -bench SignCompositions -benchtime 2s mesh.dev/services/signer/app
	$(GO) test -run '^$$' -bench . mesh.dev/services/catalog/app mesh.dev/internal/natsx
	$(GO) run ./cmd/meshctl bench compose --nodes 200 --modules 20
	$(GO) run ./cmd/meshctl bench converge --engines 200

images:
	deploy/images/build.sh

# Fuzz targets as package:Target; each also runs over its committed seed
# corpus (testdata/fuzz/<Target>/) in `make test`. -fuzz takes one package
# at a time. Minimization is capped so a slow target (a real engine or
# JetStream per input) spends its time fuzzing. .ci/fuzz runs one and tells
# a failure of the target from Go 1.26's own deadline race (golang/go#75804).
FUZZTIME ?= 60s
FUZZ_TARGETS := \
	mesh.dev/internal/verify:FuzzKeyset \
	mesh.dev/internal/verify:FuzzManifest \
	mesh.dev/internal/verify:FuzzComposition \
	mesh.dev/internal/lint:FuzzCheckModuleManifest \
	mesh.dev/internal/lint:FuzzCheckEntry \
	mesh.dev/internal/lint:FuzzCheckComposition \
	mesh.dev/internal/lint:FuzzCheckWants \
	mesh.dev/services/composer/internal/compose:FuzzDeclare \
	mesh.dev/services/composer/internal/compose:FuzzSplitDeclaration \
	mesh.dev/services/composer/internal/syncsvc:FuzzSyncRequests \
	mesh.dev/services/nodeengine/internal/engine:FuzzSyncResponses \
	mesh.dev/services/nodeengine/internal/apply:FuzzApply

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
		GO=$(GO) bash .ci/fuzz $$pkg $$name $(FUZZTIME); \
	done

clean:
	rm -rf $(BIN)
