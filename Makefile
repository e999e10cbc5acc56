# mgpu: the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit e2e slurmdiff k8s k8s-build venv sysdeps bench down clean dist gpu-test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# torch (CPU, the 2.13.0 wheel this project's machines carry) and mpi4py (built against
# Debian's Open MPI) for the real torchrun/mpirun tests, PyInstaller for the test that runs
# the `make dist` executables; those tests skip without them.
TEST_EXTRAS := $(VENV)/.test-extras
$(TEST_EXTRAS): $(STAMP)
	@$(BIN)/python -m pip install -q 'torch==2.13.0' || echo "make: torch unavailable; torchrun tests will skip"
	@if command -v mpicc >/dev/null; then $(BIN)/python -m pip install -q -e '.[distributed]' || echo "make: mpi4py failed to build; mpirun tests will skip"; fi
	@$(BIN)/python -m pip install -q -e '.[dist]' || echo "make: PyInstaller unavailable; the dist test will skip"
	@touch $(TEST_EXTRAS)

venv: $(STAMP)

sysdeps:
	@bash scripts/install-system-deps.sh

lint: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: venv
	$(BIN)/mypy

# Tests come in tiers: tests/unit (pure code), tests/controller (the master's controller
# in-process: fake clock, fake agents), tests/e2e (real masters and agents on loopback),
# tests/netns (multi-node on network namespaces; root).  `make unit` is the fast loop.
# The controller tier runs twice: on SQLite (the default store) and on PostgreSQL as a
# leader whose every write checks its lease (tests/pgserver.py runs the server; the run
# skips where PostgreSQL is not installed).
CONTROLLER_ON_POSTGRES := MGPU_TEST_STORE=postgres-fenced $(BIN)/pytest -q tests/controller

unit: venv
	$(BIN)/pytest -q tests/unit tests/controller
	$(CONTROLLER_ON_POSTGRES)

# The e2e tests spend much of their time waiting for processes: two workers (pytest-xdist),
# each taking whole modules (module-scoped clusters stay in one), finish them in about two
# thirds of the time on two cores.  The netns tests run alone: they pick free subnets.
# schemathesis gives its items one node id, which xdist would run once: the API fuzz test
# runs apart (tests/conftest.py refuses such ids under xdist).
E2E_WORKERS := -n 2 --dist loadscope
API_FUZZ := tests/e2e/test_api_fuzz.py

e2e: venv $(TEST_EXTRAS)
	$(BIN)/pytest -q $(E2E_WORKERS) tests/e2e --ignore=$(API_FUZZ)
	$(BIN)/pytest -q $(API_FUZZ) tests/netns

# The differential tier: the same job scripts on a real Slurm 22.05 (Debian's slurm-wlm,
# started from a config of its own) and on mgpu, compared field by field; one Slurm and one
# mgpu for the whole run, so it runs apart from xdist.  -rxs: the known differences (xfail)
# and, where Slurm cannot start, the reason it skipped.
SLURMDIFF := $(BIN)/pytest -q -rxs tests/slurmdiff

slurmdiff: venv sysdeps
	$(SLURMDIFF)

# The Kubernetes tier: a real Kubernetes 1.20 (etcd, API server, scheduler, controller
# manager, two kubelets in network namespaces with fake GPUs) per test module.
# scripts/k8s/build.sh builds it from Debian's source package once per machine (about 6
# minutes on 2 cores, cached in /var/cache/mgpu-k8s) and is instant afterwards; where it
# cannot build, the tier's tests skip with the reason.
k8s-build:
	@bash scripts/k8s/build.sh || echo "make: Kubernetes not built here; tests/k8s will skip"

k8s: venv $(TEST_EXTRAS) k8s-build
	$(BIN)/pytest -q tests/k8s

# The executables the `make dist` test runs are built while lint and typecheck run
# (PyInstaller takes a minute or more; the test then finds them up to date).
# A machine without the Kubernetes binaries builds them (niced) while the other tiers run:
# the k8s tier's own build step then waits on build.sh's lock and finds them ready.
test: sysdeps venv $(TEST_EXTRAS)
	@mkdir -p build; if ! bash scripts/k8s/build.sh --print >/dev/null 2>&1; then \
	  (nice -n 19 bash scripts/k8s/build.sh >build/k8s-build.log 2>&1 &) ; fi
	@if $(BIN)/python -c 'import PyInstaller' 2>/dev/null; then \
	  PYTHON=$(BIN)/python MGPU_DIST_DIR=$(CURDIR)/build/dist-test \
	    bash scripts/build-dist.sh >build/dist-test.log 2>&1 & fi; \
	  $(MAKE) --no-print-directory lint typecheck; status=$$?; wait; exit $$status
	$(BIN)/pytest -q tests/unit tests/controller
	$(CONTROLLER_ON_POSTGRES)
	$(BIN)/pytest -q $(E2E_WORKERS) tests/e2e --ignore=$(API_FUZZ)
	$(BIN)/pytest -q $(API_FUZZ) tests/netns
	$(SLURMDIFF)
	@$(MAKE) --no-print-directory k8s

# The GPU tier: a real master and agent on this machine's NVIDIA GPUs (no --fake-gpus).
# Every test skips where there is no GPU; not part of `make test` (docs/GPU.md says how to
# run it on a GPU machine without internet).  -rA: the passed tests' lines (the card, the
# times measured) are printed too.
gpu-test: venv
	$(BIN)/pytest -v -rA tests/gpu

demo: venv
	@bash scripts/demo.sh

down: venv
	@$(BIN)/mgpu down

bench: venv
	$(BIN)/python bench/latency.py

# Standalone executables (PyInstaller) for GPU machines without this Python environment:
# dist/mgpu_master, dist/mgpu_node, dist/mgpu_client, ... (see README, "Deployment").
dist: venv
	@PYTHON=$(BIN)/python bash scripts/build-dist.sh

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
