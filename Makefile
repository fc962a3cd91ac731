# The two entry points of the project: `make demo` and `make test`.
# Both create or reuse .venv/ at the repository root and install what they need.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The fuzz extra (atheris) on top: `make test` runs each harness once on its seeds, `make fuzz` runs them long.
FUZZ_STAMP := $(VENV)/.fuzz-installed

.PHONY: demo test test-repeat venv bench clean real-binaries fuzz

# The suite runs on parallel pytest workers, a test file per worker at a time (its module-scoped labs stay on one
# worker), the files with slow tests handed out first (tests/conftest.py orders them; --no-loadscope-reorder
# keeps that order): the real backend's waits and the outage suite's overlap with the other workers' work. Every
# lab port is chosen by the OS and every directory is under the test's own tmp_path or the worker's own, so the
# workers share nothing. Four workers on two cores: one of three sat waiting often enough to leave a fifth of
# the CPU idle.
TEST_WORKERS ?= 4
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
PYTEST := $(PY) -m pytest -q -p no:cacheprovider $(XDIST)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m lab.demo

# The real backend's binaries (etcd, kube-apiserver, kube-controller-manager) and upstream Dex are built once into
# a cache outside the tree; the suites that run on both backends then run on both, and the lab's Dex is compared
# with upstream's. Without Go the build says so loudly, those tests skip and the end of the run says again what
# was not tested (PEERING_REQUIRE_REAL_APISERVER=1: fail).
# The fuzz extra too (atheris, a binary wheel): the suite runs each harness once on its seeds.
test: $(FUZZ_STAMP)
	$(PY) -m lab.real build --optional
	$(PYTEST) $(PYTEST_ARGS); rc=$$?; \
	  $(PY) -m lab.real paths 2>&1 >/dev/null | sed 's/^\(.*\)$$/*** \1 ***/' >&2; \
	  exit $$rc

# What passes only sometimes: N whole sessions of PYTEST_ARGS (default the end-to-end and guide suites, both
# backends), each as `make test` runs it; BURN=1 runs a CPU burner per core alongside. Stops at the first failing
# run (its output in build/repeat/), prints each run's wall time; a summary in build/repeat/summary.txt.
N ?= 10
REPEAT_ARGS ?= tests/e2e
test-repeat: $(FUZZ_STAMP)
	$(PY) -m lab.real build --optional
	$(PY) tools/repeat.py --runs $(N) $(if $(filter 1,$(BURN)),--burn) -- -q -p no:cacheprovider \
	  $(XDIST) $(or $(PYTEST_ARGS),$(REPEAT_ARGS))

real-binaries: $(STAMP)
	$(PY) -m lab.real build

# Not part of `make test`: the figures belong in bench/RESULTS.md, measured on a quiet machine.
bench: $(STAMP)
	@{ command -v nginx || test -x /usr/sbin/nginx; } >/dev/null && command -v wrk >/dev/null || \
	  { echo "the gateway benchmark measures nginx as its baseline with wrk: apt-get install nginx wrk" >&2; exit 2; }
	$(PY) -m bench.gateway_bench
	$(PY) -m bench.control_bench
	$(PY) -m bench.apiserver_bench --uvloop --out bench/out/apiserver.json

# Not part of `make test` (whose hypothesis properties in tests/fuzz/ cover the same parsers): coverage-guided
# fuzzing with atheris of what parses network input, FUZZ_SECONDS per harness (fuzz/run.py); the corpora, any
# crashing input and the summary (summary.md) go to build/fuzz/. docs/fuzzing.md records the last run.
FUZZ_SECONDS ?= 60

$(FUZZ_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[dev,fuzz]'
	@touch $(FUZZ_STAMP)

fuzz: $(FUZZ_STAMP)
	$(PY) -m fuzz.run --seconds $(FUZZ_SECONDS)

clean:
	rm -rf $(VENV) build *.egg-info
