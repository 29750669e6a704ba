# The README's two commands (`make demo`, `make test`) and the benchmarks. Each target creates
# .venv and installs the pinned dependencies itself (torch: the CPU build unless TORCH=cuda; see below).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo test test-slow test-gpu gpu-check bench soak shift serve proto manifests image docs

# torch: TORCH=cpu (the default) installs the CPU build from PyTorch's CPU index, first and alone (an
# extra index for torch only: everything else comes from PyPI at its pin); TORCH=cuda installs PyPI's
# Linux wheel, the CUDA build (several GB). Both at the version deploy/constraints.txt pins.
TORCH ?= cpu
TORCH_VERSION := $(shell sed -n 's/^torch==//p' deploy/constraints.txt)
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c deploy/constraints.txt

$(INSTALLED): pyproject.toml deploy/constraints.txt
	$(PYTHON) -m venv $(VENV)
	case "$(TORCH)" in \
	  cpu) $(PIP) --no-deps --extra-index-url $(TORCH_CPU_INDEX) 'torch==$(TORCH_VERSION)+cpu' ;; \
	  cuda) $(PIP) --no-deps 'torch==$(TORCH_VERSION)' ;; \
	  *) echo "TORCH must be cpu or cuda, got '$(TORCH)'" >&2; exit 2 ;; \
	esac
	$(PIP) -e '.[test,dev,bench]'
	touch $@

# Prometheus and promtool for the tests that need them (the alert rules' unit tests in `make test`,
# the dashboard's queries in the slow suite): Debian's prometheus package, unpacked into
# .venv/prometheus; nothing is installed on the system and no service started. Needs apt (a Debian
# or Ubuntu machine); elsewhere those tests skip, saying so. apt's package lists are fetched first
# where they are missing (as root).
PROMETHEUS_BIN := $(VENV)/prometheus/usr/bin
$(PROMETHEUS_BIN)/prometheus:
	@mkdir -p $(VENV)/prometheus/deb
	@if ! command -v apt-get >/dev/null; then echo "no apt-get here: the tests that need Prometheus will skip"; exit 0; fi; \
	  cd $(VENV)/prometheus/deb && { apt-get download -qq prometheus 2>/dev/null \
	    || { apt-get update -qq && apt-get download -qq prometheus; } \
	    || { echo "could not fetch Debian's prometheus package: the tests that need it will skip"; exit 0; }; } \
	  && dpkg-deb -x prometheus_*.deb .. && rm -f prometheus_*.deb && echo "Prometheus: $$(../usr/bin/prometheus --version 2>&1 | head -1)"

demo: $(INSTALLED)
	$(BIN)/specserve demo

test: $(INSTALLED) $(PROMETHEUS_BIN)/prometheus
	PATH="$(abspath $(PROMETHEUS_BIN)):$$PATH" $(BIN)/python -m pytest

# The service in the foreground on an embedded cluster (Ctrl-C stops it).
serve: $(INSTALLED)
	$(BIN)/specserve serve

# Regenerate the gRPC stubs after editing proto/v1/*.proto (a test fails while they differ).
proto: $(INSTALLED)
	$(BIN)/python -m specserve.proto.generate

# Copy deploy/serve_config.yaml into the KubeRay RayService's serveConfigV2 and the alert rules
# (deploy/alerts/specserve-rules.yaml) into their PrometheusRule (a test fails while either differs).
# With CRD=path/to/ray.io_rayservices.yaml, also re-extract the schema the tests check it with.
manifests: $(INSTALLED)
	$(BIN)/python -m specserve.cluster.kuberay $(if $(CRD),--crd $(CRD))

# The container images the manifest names (needs a Docker engine): specserve:<version>-cuda for the
# GPU nodes, specserve:<version> (CPU torch, several GB smaller) for the others. See deploy/Dockerfile.
image:
	v=$$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml) \
	  && docker build -f deploy/Dockerfile --build-arg TORCH=cuda -t specserve:$$v-cuda . \
	  && docker build -f deploy/Dockerfile --build-arg TORCH=cpu -t specserve:$$v .

# The GPU suite (tests/test_gpu.py, marker gpu): skipped, and counted as skipped, without CUDA.
# SPECSERVE_GPU_ZOO=DIR runs it on a built zoo (default: the tiny zoo the tests build).
test-gpu: $(INSTALLED)
	$(BIN)/python -m pytest -m gpu tests/test_gpu.py

# On a CUDA machine: the GPU suite on the demo zoo, then the in-process GPU bench, into one folder
# bench/results/<time>-gpu (ZOO=DIR for another zoo).
gpu-check: $(INSTALLED)
	PYTHON=$(BIN)/python .ci/gpu-check $(ZOO)

# Minutes of mixed load while workers are killed and frozen at random; reports requests by status,
# tokens lost (must be 0) and memory over time. Not part of `make test`. MINUTES=n to change.
soak: $(INSTALLED)
	$(BIN)/specserve soak $(if $(MINUTES),--minutes $(MINUTES))

# A task's traffic shifting to another corpus: alpha falling, the alert firing in a real Prometheus,
# a head re-distilled from the served sample, its canary promoted, alpha back (bench/shift.py; ~15 min).
shift: $(INSTALLED) $(PROMETHEUS_BIN)/prometheus
	PATH="$(abspath $(PROMETHEUS_BIN)):$$PATH" $(BIN)/specserve shift

# Long suites (more sampling settings, bigger budgets): see docs/pages/tests.md.
test-slow: $(INSTALLED) $(PROMETHEUS_BIN)/prometheus
	PATH="$(abspath $(PROMETHEUS_BIN)):$$PATH" $(BIN)/python -m pytest -m slow

# The benchmark report (bench/results/<timestamp>/): builds the bench zoo first (over an hour on 2 CPU cores, once).
bench: $(INSTALLED)
	$(BIN)/specserve zoo build --preset bench
	$(BIN)/specserve bench

# The documentation site (MkDocs, docs/mkdocs.yml) into docs/site/; strict: a broken link fails it.
docs: $(INSTALLED)
	$(BIN)/python -m mkdocs build --strict -f docs/mkdocs.yml
