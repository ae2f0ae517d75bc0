# Two commands for a newcomer (see README): `make demo` and `make test`.
# Both create .venv, install fedbalance with every extra, and (as root, where apt exists)
# the Debian packages OpenMPI and dataset-fashion-mnist.

VENV    ?= .venv
PY      := $(VENV)/bin/python
# torch/torchvision are served from this project's machines' local disk at these versions;
# override on other machines, e.g. `make TORCH_SPEC='torch torchvision' test`.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
# OpenMPI (mpi4py's build, the MPI runs) and Fashion-MNIST: `make setup`. Chromium and its
# driver drive the docs site's browser test (tests/docs_site) and only that: `make test-docs`.
APT_PACKAGES := openmpi-bin libopenmpi-dev dataset-fashion-mnist
BROWSER_APT_PACKAGES := chromium chromium-driver
PYTEST_ARGS ?=
# Installs go through uv where it can be had (parallel: in clean-clone runs of `make test` the
# main environment was ready after 118 s, against pip's 232 s), with pip's own settings carried
# over; FEDBALANCE_INSTALLER=pip installs with pip. See tools/install.py.
INSTALL := python3 tools/install.py
# Test processes: many tests wait on the processes they start, so two workers on two cores
# finish well before one. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
# Flower's own environment: flwr needs protobuf>=5 and FedML 0.9.6 protobuf<4, so the Flower
# tests (tests/flower) run in a second venv. torch is hard-linked from $(VENV) (tests/stacks.py).
FLOWER_VENV ?= .venv-flower
FLOWER_PY   := $(FLOWER_VENV)/bin/python
# The suite runs on the newest Flower fedbalance supports (1.42, $(FLOWER_VENV)) and a smoke lane
# (the bundled app in both engines, SecAgg+) on the oldest (1.41).
FLOWER_OLD_RELEASE := 1.41
FLOWER_OLD_VENV ?= .venv-flower-$(FLOWER_OLD_RELEASE)
FLOWER_OLD_PY   := $(FLOWER_OLD_VENV)/bin/python
# The documentation's own environment: MkDocs (Material), mkdocstrings (reads the source, imports
# nothing), Selenium for the browser test. Pinned so `make docs` builds the same site everywhere.
DOCS_VENV ?= .venv-docs
DOCS_SPEC := mkdocs==1.6.1 mkdocs-material==9.8.2 mkdocstrings==1.0.8 mkdocstrings-python==2.0.11 \
	mkdocs-autorefs==1.4.5 pymdown-extensions==13.1.2 griffelib==2.4.1 selenium==4.51.0 pytest==9.2.0 pytest-timeout==2.4.0

.PHONY: setup setup-flower setup-flower-oldest test-flower-oldest system-deps browser-deps demo test test-flower test-docs docs test-fast test-cuda fuzz lint bench-perf clean

# Bytecode for the editable install's own modules: where PYTHONDONTWRITEBYTECODE is set (it is on
# this project's machines), Python never caches it, so every process (each MPI rank, ClientApp,
# CLI run) compiled the modules it imports again: 0.6 of the 3.9 s importing
# fl_adapters.fedml.runner took, a few tenths of a second of `import fedml`'s 8 (that one within
# its run-to-run spread): too little to show in a whole `make test` here (its times: see test).
# compileall writes only what is missing or stale: a second or less.
SOURCES := fl_checks fl_aggregators fl_partitions adapters benchmarks

setup: system-deps $(VENV)/.installed
	@$(PY) -m compileall -q $(SOURCES)

# $(call apt_install,PACKAGES,WHAT THEY ARE FOR): installs those not installed yet, as root where
# apt-get exists; elsewhere says which are missing.
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "note: not root or no apt-get; install these for $(2):$$missing"; \
	fi
endef

system-deps:
	$(call apt_install,$(APT_PACKAGES),MPI runs and Fashion-MNIST)

browser-deps:
	$(call apt_install,$(BROWSER_APT_PACKAGES),the docs site's browser test)

# torch first, on its own stamp: Flower's environment links it from here (tests/stacks.py) while
# the rest installs. `packaging`: tests/stacks.py reads requirements with it.
$(VENV)/.torch:
	test -x $(PY) || python3 -m venv $(VENV)
	$(INSTALL) $(VENV) $(TORCH_SPEC) packaging
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	@if command -v mpicc >/dev/null; then extras=all; else extras=fedlab,fedml,bench,dev; \
		echo "note: no MPI compiler (mpicc); installing without the mpi extra"; fi; \
	$(INSTALL) $(VENV) -e ".[$$extras]"
	touch $@

setup-flower: $(FLOWER_VENV)/.installed
	@$(FLOWER_PY) -m compileall -q $(SOURCES)

# Seconds once (torch is linked, not installed), nothing while the stamp is newer than its inputs.
# Needs only torch in $(VENV), not the rest: `make test` builds it while $(VENV) installs.
$(FLOWER_VENV)/.installed: pyproject.toml tests/stacks.py $(VENV)/.torch
	$(PY) tests/stacks.py flower $(FLOWER_VENV)
	$(INSTALL) $(FLOWER_VENV) -e ".[flower,bench,dev]"
	touch $@

setup-flower-oldest: $(FLOWER_OLD_VENV)/.installed

# The same, on the oldest Flower release fedbalance supports (its stack pins flwr 1.41.*, which
# the extra's flwr>=1.41 keeps: installing fedbalance never changes the user's Flower).
$(FLOWER_OLD_VENV)/.installed: pyproject.toml tests/stacks.py $(VENV)/.torch
	$(PY) tests/stacks.py flower-oldest $(FLOWER_OLD_VENV)
	$(INSTALL) $(FLOWER_OLD_VENV) -e ".[flower,bench,dev]"
	touch $@

$(DOCS_VENV)/.installed: Makefile
	test -x $(DOCS_VENV)/bin/python || python3 -m venv $(DOCS_VENV)
	$(INSTALL) $(DOCS_VENV) $(DOCS_SPEC)
	touch $@

# The site, strict: a broken link, anchor, include or API reference fails the build. The
# partitioners' pictures are drawn from the code first (main environment).
docs: setup $(DOCS_VENV)/.installed
	$(PY) -m fedbalance_benchmarks.docs_pictures build/docs-pictures
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

# The built site in headless Chromium (tests/docs_site); the README's and pages' runnable
# blocks are tests of the main suite (tests/test_docs.py).
test-docs: docs browser-deps
	$(DOCS_VENV)/bin/python -m pytest tests/docs_site --confcutdir=tests/docs_site -p no:cacheprovider $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/fedbalance demo --out runs/demo

lint: setup
	$(PY) -m ruff check fl_checks fl_aggregators fl_partitions adapters benchmarks tests tools docs/hooks.py
	$(PY) -m ruff format --check fl_checks fl_aggregators fl_partitions adapters benchmarks tests tools docs/hooks.py
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# Three lanes run side by side: the main suite; the Flower 1.42 suite; ruff, mypy, import
# contracts and the docs, then the Flower 1.41 smoke lane (its environment builds in the
# background from when Flower's is ready). Both cores are busy throughout, so what counts is the
# CPU all of them take and how little runs alone at the end. At caa4074 (clean clone, cc18) the
# main suite finished after 976 s and the Flower lane, with the 1.41 lane after its suite, after
# 1,065 s: the 1.41 lane (81 s) ran alone at the end. With it after lint and the docs (cc19):
# main suite 1,041 s, Flower lane 1,046 s, the lint, docs and 1.41 lane 334 s. Most of the CPU
# is processes starting: a FedML rank's `import fedml` (4.4 CPU-s with fedbalance's
# paused collector, 6.6 without: `fedbalance bench host-import`), Flower's ClientApp processes
# (one per message), SuperLinks, SuperNodes and Ray; FEDBALANCE_TEST_CPU=FILE logs each test's
# CPU (conftest). The same commit on the same machine has taken 1,219 to 1,600 s hours apart,
# so compare runs made side by side.
# Each lane's output goes to its log (.flower-tests.log, .lint-docs.log), shown when all are
# done; the target fails if any does. Each lane says after how many seconds it finished.
# --dist worksteal: `load` handed one worker the last chunk of the file order (the FedML resume
# and installed-wheel runs) while the other sat idle for 280 s of a 636 s run; a worker that runs
# out now takes half of the other's queue.
# The docs environment is built from the start and Flower's once torch is in $(VENV) (its only
# need of it), both while $(VENV) installs. The main suite starts as soon as $(VENV) is installed:
# waiting for the other two as well held it up 25-67 s in clean-clone runs. A failed install
# fails the target after the other lanes end.
# On a fresh machine apt runs off the main suite's path: OpenMPI and Fashion-MNIST install beside
# torch (-j2; neither needs the other, and mpi4py's build after both needs mpicc), Chromium when
# the lint and docs lane reaches the browser test (chromium, chromium-common and chromium-driver
# alone are 121 MB of packages; the five packages with their dependencies were 177 Debian
# packages and 30 s of apt-get install on this machine when it was fresh).
test:
	@rm -f .flower-tests.rc .setup.rc .docs-setup.rc .oldest-setup.rc .lint-docs.rc .oldest-tests.rc; \
	start=$$(date +%s); \
	( $(MAKE) --no-print-directory $(DOCS_VENV)/.installed > .side-setup.log 2>&1; \
		echo $$? > .docs-setup.rc ) & \
	$(MAKE) --no-print-directory -j2 system-deps $(VENV)/.torch || { wait; exit 1; }; \
	( { if $(MAKE) --no-print-directory setup-flower; then \
		( $(MAKE) --no-print-directory setup-flower-oldest > .oldest-setup.log 2>&1; \
			echo $$? > .oldest-setup.rc ) & \
		$(MAKE) --no-print-directory test-flower; \
		else echo 1 > .oldest-setup.rc; false; fi; echo $$? > .flower-tests.rc; \
		echo "Flower lane finished after $$(( $$(date +%s) - start )) s"; \
		} > .flower-tests.log 2>&1 ) & \
	$(MAKE) --no-print-directory setup; echo $$? > .setup.rc; \
	[ "$$(cat .setup.rc)" = 0 ] || { wait; until [ -e .oldest-setup.rc ]; do sleep 2; done; exit 1; }; \
	( { until [ -e .docs-setup.rc ]; do sleep 2; done; cat .side-setup.log; \
		if [ "$$(cat .docs-setup.rc)" = 0 ]; then \
			$(MAKE) -k --no-print-directory lint test-docs; rest=$$?; else rest=1; fi; \
		echo $$rest > .lint-docs.rc; \
		echo "lint and docs finished after $$(( $$(date +%s) - start )) s"; \
		until [ -e .oldest-setup.rc ]; do sleep 2; done; cat .oldest-setup.log; \
		if [ "$$(cat .oldest-setup.rc)" = 0 ]; then \
			$(MAKE) --no-print-directory test-flower-oldest; oldest=$$?; else oldest=1; fi; \
		echo $$oldest > .oldest-tests.rc; \
		echo "Flower $(FLOWER_OLD_RELEASE) lane finished after $$(( $$(date +%s) - start )) s"; \
		} > .lint-docs.log 2>&1 ) & \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=25 $(PYTEST_ARGS); main=$$?; \
	echo "main suite finished after $$(( $$(date +%s) - start )) s"; \
	wait; echo "---- Flower suite (in $(FLOWER_VENV); log: .flower-tests.log) ----"; \
	cat .flower-tests.log; \
	echo "---- lint, docs, Flower $(FLOWER_OLD_RELEASE) (in $(VENV), $(DOCS_VENV), $(FLOWER_OLD_VENV); log: .lint-docs.log) ----"; \
	cat .lint-docs.log; flower=$$(cat .flower-tests.rc 2>/dev/null || echo 1); \
	rest=$$(cat .lint-docs.rc 2>/dev/null || echo 1); oldest=$$(cat .oldest-tests.rc 2>/dev/null || echo 1); \
	echo "make test: main suite exit $$main, Flower suite exit $$flower, lint and docs exit $$rest, Flower $(FLOWER_OLD_RELEASE) exit $$oldest"; \
	[ $$main -eq 0 ] && [ $$flower -eq 0 ] && [ $$rest -eq 0 ] && [ $$oldest -eq 0 ]

test-flower: setup-flower
	$(FLOWER_PY) -m mypy --follow-imports=silent adapters/flower benchmarks/perf_flower_overhead.py
	$(FLOWER_PY) -m pytest tests/flower --durations=10 $(PYTEST_ARGS)

# The smoke lane on the oldest supported Flower: its version check, the strategy on its messages,
# and the runs marked smoke (the bundled app in both engines, SecAgg+).
test-flower-oldest: setup-flower-oldest
	FEDBALANCE_FLWR_RELEASE=$(FLOWER_OLD_RELEASE) $(FLOWER_OLD_PY) -m pytest \
		tests/flower/test_environment.py tests/flower/test_strategy.py tests/flower/test_runs.py \
		tests/flower/test_secure.py -m "smoke or not slow" --durations=5 $(PYTEST_ARGS)

# Skips the slow end-to-end runs (real frameworks, real processes); CI runs everything.
test-fast: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Exploration, not part of `make test` or CI: the property tests with random seeds and 10x
# their examples (tests/conftest.py). Finds are kept in .hypothesis/; pin each with @example.
fuzz: setup
	FEDBALANCE_HYPOTHESIS=fuzz $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# The CUDA path (tests/cuda): aggregators on GPU tensors, training on a GPU model, FedLab's stock
# example with cuda=True armed with fedbalance. Needs a CUDA device; not part of `make test` or CI
# (which have none), so the main suite is the same on every machine.
test-cuda: setup
	FEDBALANCE_CUDA_TESTS=1 $(PY) -m pytest tests/cuda -p no:cacheprovider $(PYTEST_ARGS)

bench-perf: setup
	$(VENV)/bin/fedbalance bench perf-partition

clean:
	rm -rf $(VENV) $(FLOWER_VENV) $(FLOWER_OLD_VENV) $(DOCS_VENV) .venv-uv .venv-stacks runs build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
