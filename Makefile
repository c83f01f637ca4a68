# The two commands a newcomer types: `make demo` and `make test`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers for `make conformance`
JOBS ?= auto
# conformance-edref: samples per OpInfo and dtype (0: every one)
SAMPLES ?= 0

.PHONY: demo test check heavy mutate lint format docs wheel coverage-graph parity conformance conformance-merge conformance-resume conformance-compiled conformance-edref models zoo devsuites stress memcheck bench report corpus install clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Installs torch first, pinned, so pip never resolves a bare `torch` (a multi-GB CUDA build);
# then the package against it without build isolation (it compiles csrc/ against that torch).
$(VENV)/.installed: $(VENV)/bin/python pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h)
	$(PY) -m pip install -q --upgrade "setuptools>=64" wheel
	$(PY) -m pip install -q "$(TORCH)" numpy
	$(PY) -m pip install -q --no-build-isolation -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m eagerdecomp.demo

# the whole suite on every core (pytest-xdist); the slowest tests listed at the end
TEST_JOBS ?= auto
test: install
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadgroup -m "not heavy" --durations=15 $(PYTEST_ARGS)

# the parametrizations make test leaves out (tests/conftest.py HEAVY)
heavy: install
	$(PY) -m pytest -n $(TEST_JOBS) -m heavy $(PYTEST_ARGS)

# the mutation check: plants representative defects one at a time (a wrong constant, a dropped
# stride, a swapped random parameter, an ignored decompositions=, issue 50's normal) and prints
# which tests caught each; fails if one is caught by none (tests/mutate.py; minutes; make heavy runs it too)
mutate: install
	$(PY) -m tests.mutate $(MUTANTS)

# the edit-test loop: the front door, the runtime, the op facts, the decomposition tables and the
# pointwise family (no model zoo, no browser, no conformance); a few minutes on 2 cores
CHECK_TESTS ?= tests/test_mode.py tests/test_errors.py tests/test_architecture.py tests/test_docs.py tests/ops \
	tests/runtime tests/device/test_switch.py tests/decompositions/test_table.py tests/decompositions/test_pointwise.py \
	tests/decompositions/test_twins.py
check: install
	$(PY) -m pytest -n $(TEST_JOBS) -m "not heavy" $(CHECK_TESTS) $(PYTEST_ARGS)

# every runtime test file on the pure-Python path (no C++ key, no C++ hit path); make test runs a slice
PARITY_TESTS ?= tests/test_mode.py tests/runtime/test_bundle.py tests/runtime/test_cache.py tests/runtime/test_routes.py tests/runtime/test_lift.py tests/runtime/test_lift_lists.py \
	tests/runtime/test_semantics.py tests/runtime/test_threads.py tests/runtime/test_family.py tests/runtime/test_disk.py tests/test_training.py
parity: install
	EAGERDECOMP_NO_EXT=1 $(PY) -m pytest $(PARITY_TESTS) $(PYTEST_ARGS)

# SHARD=i/n runs one of n disjoint parts (rows kept in reports/shards/PART/); conformance-merge
# then writes the one summary from all n, so the full run can span machines or sessions.
# CONF_TESTS narrows the files: test_opinfo.py alone is the per-sample table, about a sixth
# of the time of the whole suite (the cross-sample run traces every sample again).
# OPSET= the preset the samples are lowered to (default core_aten; OPSET=prims_fusion), the
# witness checking against the same one; another preset's reports go to reports/OPSET/.
SHARD ?=
PART ?= all
CONF_TESTS ?= tests/conformance
OPSET ?= core_aten
CONF_REPORTS := reports$(if $(filter-out core_aten,$(OPSET)),/$(OPSET))
conformance: install
	EAGERDECOMP_CONFORMANCE=full EAGERDECOMP_CONFORMANCE_SHARD=$(SHARD) EAGERDECOMP_CONFORMANCE_PART=$(PART) \
		EAGERDECOMP_CONFORMANCE_OPSET=$(OPSET) $(PY) -m pytest $(CONF_TESTS) -q -n $(JOBS) $(PYTEST_ARGS)

conformance-merge: install
	EAGERDECOMP_CONFORMANCE_OPSET=$(OPSET) $(PY) -m tests.conformance.summary $(CONF_REPORTS) $(PART)

# every shard of a SHARDS-way split that has no rows in reports/shards/PART/ yet, then the
# merge: stopped at any point, the next run goes on from the first missing shard
SHARDS ?= 12
conformance-resume: install
	for i in $$(seq 1 $(SHARDS)); do \
		[ -f $(CONF_REPORTS)/shards/$(PART)/$$i-of-$(SHARDS).json ] || $(MAKE) conformance SHARD=$$i/$(SHARDS) || true; \
	done
	$(MAKE) conformance-merge

# every OpInfo sample (fn, in-place, out=; float32/float64/int64/bool) natively on CPU and on edref
# with the switch and the CPU tier (on_unsupported="cpu"); reports/conformance-edref.md counts the
# classes and the samples that used the tier (make test runs every 16th test at one sample)
conformance-edref: install
	rm -rf reports/conformance-edref/rows
	EAGERDECOMP_CONFORMANCE=full EAGERDECOMP_CONFORMANCE_SAMPLES=$(SAMPLES) $(PY) -m pytest \
		tests/conformance/test_device_tier.py -q -n $(JOBS) $(PYTEST_ARGS); s=$$?; \
		$(PY) -m tests.conformance.device --summary > /dev/null || s=1; exit $$s

# the OpInfo suite with compile="inductor": every OpInfo, capped at 2 samples per dtype (each
# sample compiles its kernels), answered by the compiled code and compared with eager
conformance-compiled: install
	EAGERDECOMP_CONFORMANCE=full EAGERDECOMP_CONFORMANCE_SAMPLES=2 EAGERDECOMP_CONFORMANCE_COMPILE=inductor \
		$(PY) -m pytest tests/conformance/test_opinfo.py -q -n $(JOBS) $(PYTEST_ARGS)

# every model of tests/test_models.py (make test runs its fast slice), under the mode and on edref
# (FALLBACK=cpu: the edref steps with the CPU tier on)
FALLBACK ?=
models: install
	EAGERDECOMP_MODELS=all EAGERDECOMP_MODELS_FALLBACK=$(FALLBACK) $(PY) -m pytest tests/test_models.py $(PYTEST_ARGS)

# every model of the shipped corpus, natively and under the mode (DEVICE=edref: on the reference
# device with the switch), one child per 8 models (make test runs 3, and 1 on edref); a row per
# model in reports/zoo[-DEVICE]/rows/ (a later run goes on from the first missing one), then
# reports/zoo[-DEVICE].md. About an hour on one core. DEVICE=edref:cpu: with the CPU tier on
# (on_unsupported="cpu"); the summary names the ops each model ran there. DEVICE=edprims: on the
# prims reference device; OPSET=prims_fusion: under the mode with that preset (reports/zoo-prims_fusion.md).
# EVERY=N: every Nth model only (a sample; the summary counts the rows written).
DEVICE ?=
OPSET ?= core_aten
EVERY ?= 1
zoo: install
	EAGERDECOMP_ZOO=all EAGERDECOMP_ZOO_DEVICE=$(DEVICE) EAGERDECOMP_ZOO_OPSET=$(OPSET) EAGERDECOMP_ZOO_EVERY=$(EVERY) $(PY) -m pytest tests/test_zoo.py $(PYTEST_ARGS); s=$$?; \
		$(PY) -m tests.zoo $(if $(DEVICE),--device $(DEVICE)) --opset $(OPSET) --summary > /dev/null; exit $$s

# PyTorch's own device-generic test suites (../shared/data/pytorch-tests: test_view_ops, test_torch,
# test_nn; PyTorch 2.4.0's) on edref with the switch and on CPU, from a temporary copy; fails on any
# result tests/devsuites/known.py does not expect. Summary in reports/devsuites.md. About an hour
# on 2 cores (make test runs a fixed slice: tests/test_devsuites.py). DEVICE=edprims: on the prims
# reference device instead (summary in reports/devsuites-edprims.md).
DEVSUITE_JOBS ?= 2
devsuites: install
	$(PY) -m tests.devsuites --jobs $(DEVSUITE_JOBS) $(if $(DEVICE),--device $(DEVICE)) $(DEVSUITE_ARGS)

# the concurrency tests at length: many runs of threads x ops x shapes against native (make test runs 3)
STRESS_RUNS ?= 100
stress: install
	EAGERDECOMP_STRESS_RUNS=$(STRESS_RUNS) EAGERDECOMP_STRESS_THREADS=6 $(PY) -m pytest tests/runtime/test_threads.py $(PYTEST_ARGS)

# the CPU tier under valgrind's memcheck: no host copy smaller than what its CPU kernel touches
# (expanded fused-optimizer arguments, outs the kernel grows); about 30 minutes on 2 cores
memcheck: install
	command -v valgrind >/dev/null || (apt-get update -qq && apt-get install -y -qq valgrind >/dev/null)
	$(PY) tests/device/memcheck.py

# the benchmarks; those the docs render write their JSON to bench/results/ (then: make docs)
bench: install
	$(PY) bench/step.py --json bench/results/step.json
	$(PY) bench/device.py --json bench/results/device.json
	$(PY) bench/inductor.py --steps 20 --json bench/results/inductor.json
	$(PY) bench/device_profile.py --perf-steps 2000 --json bench/results/device_profile.json
	$(PY) bench/micro.py --json bench/results/micro.json
	$(PY) bench/threads.py --json bench/results/threads.json
	$(PY) bench/threads.py --native --pytorch-pitfalls --rounds 25 --json bench/results/threads-pitfalls.json
	$(PY) bench/conformance.py --json bench/results/conformance.json
	$(PY) bench/corpus.py --json bench/results/corpus.json
	$(PY) bench/fallback.py --json bench/results/fallback.json
	$(PY) bench/shapes.py --sections unseen,prompt,cold --json bench/results/shapes.json
	$(PY) bench/key.py
	$(PY) bench/compile.py

# the wheel as users get it: an sdist from a clean copy, the wheel from the sdist with its C++
# library compiled (minutes), installed away from the checkout and run there (make test runs a
# pure-Python wheel with the checkout's compiled library in its place)
wheel: install
	EAGERDECOMP_WHEEL=full $(PY) -m pytest tests/test_wheel.py $(PYTEST_ARGS)

# the measured tables of README.md and docs/ rendered from bench/results/*.json
docs:
	$(PY) bench/render.py

# ruff's lint and format check, and the rendered tables' freshness
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) bench/render.py --check

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# the coverage report in the terminal, and as a static page: open coverage.html in a browser
report: install
	$(PY) -m eagerdecomp coverage --summary
	$(PY) -m eagerdecomp coverage --format html -o coverage.html
	$(PY) -m eagerdecomp coverage --models --summary

# rebuild the decomposition graph the package ships (eagerdecomp/coverage/data/graph.json.gz) for
# $(TORCH): after a change to the decompositions or to the code that builds the graph, whose
# fingerprint then no longer matches (tests/coverage/test_shipped.py says so). Minutes on 2 cores.
coverage-graph: install
	nice $(PY) -m eagerdecomp coverage graph

# re-record the shipped model corpus (eagerdecomp/coverage/data/models.json) from transformers'
# architectures and the hand-written CNNs: tens of minutes on 2 cores, resumable if stopped
corpus: install
	nice $(PY) -m eagerdecomp coverage record

clean:
	rm -rf $(VENV) build *.egg-info eagerdecomp/*.so
