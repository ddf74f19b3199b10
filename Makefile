# longmoe: every target that needs the virtual environment builds it first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export PYTHONHASHSEED := 0

.PHONY: venv test test-unit test-all lint format bench bench-cpu llama-server demo image clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,peers]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check longmoe tests bench
	$(BIN)/lint-imports --no-cache

format: $(STAMP)
	$(BIN)/ruff format longmoe tests bench
	$(BIN)/ruff check --fix longmoe tests bench

# the test tiers (tests/README.md): unit (no process, server or browser), + integration = test (CI),
# + slow = test-all. The unit tier runs on UNIT_WORKERS pytest-xdist workers (one torch thread each),
# a test module's tests on one worker (its module fixtures are built once).
UNIT_WORKERS ?= 2
test-unit: lint
	$(BIN)/pytest -q -n $(UNIT_WORKERS) --dist loadscope -m 'not slow and not integration'

test: lint
	$(BIN)/pytest -q

test-all: lint
	$(BIN)/pytest -q -m ''

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

# longmoe vs llama.cpp on CPU (bench/cpu_serve.py; bench/cpu_serve_users.py against llama-server); builds
# llama-cpp-python and llama-server from source (long on 2 cores)
bench-cpu: $(STAMP) llama-server
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/pip install --quiet -e '.[cpu-peer]'
	$(BIN)/python -m bench.cpu_serve
	$(BIN)/python -m bench.cpu_serve_users
	$(BIN)/python -m bench.gemv

# llama.cpp's own server, the peer of bench/cpu_serve_users.py (optional; CI does not build it): the llama.cpp
# vendored in the llama-cpp-python source package, built with cmake into .cache/llama-server (ignored).
# Several CPU-minutes: niced, LLAMA_SERVER_JOBS (1) compile jobs. GIT_DIR keeps cmake's build-info from
# reading longmoe's own repository (the source package has no git metadata: version "unknown"), so
# build-info.txt records the package, its SHA-256 and the cmake flags instead.
LLAMA_CPP_PY       ?= 0.3.36
LLAMA_SERVER_DIR   := .cache/llama-server
LLAMA_SERVER_JOBS  ?= 1
LLAMA_SERVER_CMAKE := -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DBUILD_SHARED_LIBS=OFF
llama-server: $(LLAMA_SERVER_DIR)/bin/llama-server

$(LLAMA_SERVER_DIR)/bin/llama-server: | $(STAMP)
	mkdir -p $(LLAMA_SERVER_DIR)/src $(LLAMA_SERVER_DIR)/bin
	test -f $(LLAMA_SERVER_DIR)/src/llama_cpp_python-$(LLAMA_CPP_PY).tar.gz || $(BIN)/pip download --quiet \
	  --no-binary :all: --no-deps llama-cpp-python==$(LLAMA_CPP_PY) -d $(LLAMA_SERVER_DIR)/src
	tar -xzf $(LLAMA_SERVER_DIR)/src/llama_cpp_python-$(LLAMA_CPP_PY).tar.gz -C $(LLAMA_SERVER_DIR)/src
	GIT_DIR=/nonexistent cmake -S $(LLAMA_SERVER_DIR)/src/llama_cpp_python-$(LLAMA_CPP_PY)/vendor/llama.cpp \
	  -B $(LLAMA_SERVER_DIR)/build $(LLAMA_SERVER_CMAKE)
	GIT_DIR=/nonexistent nice -n 10 cmake --build $(LLAMA_SERVER_DIR)/build --target llama-server \
	  -j $(LLAMA_SERVER_JOBS)
	{ echo "llama.cpp vendored in llama-cpp-python $(LLAMA_CPP_PY) (source package, sha256 \
	$$(sha256sum $(LLAMA_SERVER_DIR)/src/llama_cpp_python-$(LLAMA_CPP_PY).tar.gz | cut -c1-64))"; \
	  echo "cmake $(LLAMA_SERVER_CMAKE)"; grep -E '^(GGML_[A-Z0-9_]+|CMAKE_C_COMPILER|CMAKE_CXX_FLAGS_RELEASE):' \
	  $(LLAMA_SERVER_DIR)/build/CMakeCache.txt; } > $(LLAMA_SERVER_DIR)/bin/build-info.txt
	cp $(LLAMA_SERVER_DIR)/build/bin/llama-server $(LLAMA_SERVER_DIR)/bin/llama-server

demo: $(STAMP)  # the README's demo rows and the report card come from this run's own report.json, never by hand
	$(BIN)/python -m longmoe demo --run-dir runs/demo
	$(BIN)/python -m bench.tables --demo runs/demo
	$(BIN)/python -m longmoe report --out docs/report.md

# The serving image (deploy/Containerfile, docs/deploy.md). IMAGE_BASE: the base image (on a host with
# no registry, deploy/base-image.sh builds the default from Debian packages); a local wheel directory
# (torch's CPU wheel) and the host CA bundle are mounted into the build when they exist.
IMAGE      ?= localhost/longmoe:latest
IMAGE_BASE ?= docker.io/library/python:3.11-slim-bookworm
WHEELS     ?= /opt/wheels
CA_BUNDLE  ?= /etc/ssl/certs/ca-certificates.crt
export CONTAINERS_CONF ?= $(CURDIR)/deploy/containers.conf
image:
	podman image exists $(IMAGE_BASE) || podman pull $(IMAGE_BASE) || deploy/base-image.sh $(IMAGE_BASE)
	podman build -f deploy/Containerfile -t $(IMAGE) --build-arg BASE=$(IMAGE_BASE) \
	  $(if $(wildcard $(WHEELS)),--volume $(WHEELS):/wheels:ro) \
	  $(if $(wildcard $(CA_BUNDLE)),--volume $(CA_BUNDLE):/etc/ssl/certs/host-ca.crt:ro) \
	  $(if $(wildcard $(WHEELS)),--build-arg PIP_FIND_LINKS=/wheels) \
	  $(if $(wildcard $(CA_BUNDLE)),--build-arg PIP_CERT=/etc/ssl/certs/host-ca.crt) .

clean:
	rm -rf $(VENV) runs .pytest_cache
