# rh3dgs developer entry points. Everything lives in a project-local .venv.
#   make install  - .venv with pinned deps + rh3dgs editable with its compiled extension (idempotent)
#   make demo     - run the main job on the embedded synthetic scene, print where results are
#   make test     - the test suite (CPU); first installs what it needs outside pip when missing
#                   (chromium, node/npm, the browser driver: scripts/setup_system.sh test)
#   make bench    - benchmarks with ratios (benchmarks/results/)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-installed
EXT_STAMP := $(VENV)/.rh3dgs-built
# system packages (apt-get, sudo when not root) and the npm browser driver, only where missing
SETUP := scripts/setup_system.sh
NATIVE_SRC := $(wildcard csrc/*.cpp csrc/*.h csrc/cpu/*.cpp csrc/cpu/*.h csrc/cuda/*.cu csrc/cuda/*.h csrc/cuda/*.cuh)
# CUDA kernels: auto = when a GPU and nvcc are present (see setup.py); where torch is a CUDA build and no
# toolkit is found, `$(SETUP) cuda` first installs nvcc from PyPI into the venv
RH3DGS_BUILD_CUDA ?= auto
export RH3DGS_BUILD_CUDA

.PHONY: install demo test test-fast test-setup bench clean

install: $(EXT_STAMP)

$(DEPS_STAMP): requirements.txt
	@PYTHON=$(PYTHON) $(SETUP) build
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24" wheel setuptools
	$(PY) -m pip install -r requirements.txt
	@touch $@

$(EXT_STAMP): $(DEPS_STAMP) setup.py scripts/cuda_toolchain.py $(NATIVE_SRC)
	@PYTHON=$(PY) $(SETUP) cuda
	MAX_JOBS=2 $(PY) -m pip install --no-build-isolation --no-deps -e .
	@touch $@

demo: install
	$(VENV)/bin/rh3dgs demo --output outputs/demo --overwrite

test: install test-setup
	$(PY) -m pytest -q tests

test-fast: install test-setup
	$(PY) -m pytest -q -m "not slow" tests

test-setup:
	@$(SETUP) test

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf build *.egg-info rh3dgs/_C*.so outputs

.PHONY: bench-quality
bench-quality: install
	$(VENV)/bin/rh3dgs eval --suite synthetic --part dev --threads 1 --output outputs/eval_suite_dev --overwrite
	$(VENV)/bin/rh3dgs eval --suite synthetic --part test --threads 1 --output outputs/eval_suite_test --overwrite
	$(VENV)/bin/rh3dgs eval --suite synthetic --part dev --geometry-noise 1.0 --threads 1 --output outputs/eval_suite_dev_recon --overwrite
	$(VENV)/bin/rh3dgs eval --suite synthetic --part test --geometry-noise 1.0 --threads 1 --output outputs/eval_suite_test_recon --overwrite
	$(VENV)/bin/rh3dgs eval --suite synthetic --combine outputs/eval_suite_dev outputs/eval_suite_test outputs/eval_suite_dev_recon outputs/eval_suite_test_recon --markdown docs/results.md --overwrite
