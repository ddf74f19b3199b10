# longmoe: every target that needs the virtual environment builds it first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export PYTHONHASHSEED := 0

.PHONY: venv test test-all lint format bench bench-cpu demo clean

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

test: lint
	$(BIN)/pytest -q

test-all: lint
	$(BIN)/pytest -q -m ''

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

# longmoe vs llama.cpp on CPU (bench/cpu_serve.py); builds llama-cpp-python from source (long on 2 cores)
bench-cpu: $(STAMP)
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/pip install --quiet -e '.[cpu-peer]'
	$(BIN)/python -m bench.cpu_serve
	$(BIN)/python -m bench.gemv

demo: $(STAMP)
	$(BIN)/python -m longmoe demo

clean:
	rm -rf $(VENV) runs .pytest_cache
