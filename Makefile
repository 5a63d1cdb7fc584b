# TileMatrix: `make run` starts everything on a fresh clone; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOOLCHAIN_0113 := var/toolchains/tilelang-0.1.13
# The release between 0.1.13 and the project's 0.1.15: bisection across
# toolchains (docs/bisection.md) runs the CPU cells on all three.
TOOLCHAIN_0114 := var/toolchains/tilelang-0.1.14
# The demo opens on the H200 lab's evidence: TileLang 0.1.13 (current) and
# 0.1.15 on the served shapes, and the compile-only ROCm and Metal columns.
DEMO_EVIDENCE := $(sort $(wildcard docs/evidence/*-h200-*.evidence.json))
# 0.1.15's decode gemm at the power cap, on the gemm revision it measured.
DEMO_SUSTAINED := docs/evidence/2026-12-03-h200-sustained-speed-decode.json

.PHONY: run test install migrate seed lint bench-local toolchains clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, so the project's torch range installs nothing more.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(PY) manage.py migrate --noinput

seed: migrate
	$(PY) manage.py seed_demo
	# The other two models the H200 evidence serves, so the Models page
	# counts each model's own calls (shapes they share included).
	$(PY) manage.py import_shapes --profile mixtral-8x7b
	$(PY) manage.py import_shapes --profile qwen2.5-7b
	# Evidence from real GPUs, through the normal ingest, whatever its age; its
	# toolchain is the demo's current one. A refusal is shown, not fatal.
	-$(PY) manage.py evidence import --current-if-none $(DEMO_EVIDENCE)
	# Where the harness timed a decode kernel as faster but the power-cap run
	# did not, the manifest serves the reference.
	-$(PY) manage.py evidence import-sustained $(DEMO_SUSTAINED)
	$(PY) manage.py ensure_admin
	# Demo reviewers (passwords printed once), and an upgrade proposal for
	# every A/B the evidence holds (TileLang 0.1.13 -> 0.1.15 on the H200).
	$(PY) manage.py demo_upgrade $(DEMO_EVIDENCE)

run: seed
	scripts/run-dev

$(TOOLCHAIN_0113)/bin/python:
	scripts/make-toolchain-venv 0.1.13 $(TOOLCHAIN_0113)

$(TOOLCHAIN_0114)/bin/python:
	scripts/make-toolchain-venv 0.1.14 $(TOOLCHAIN_0114)

toolchains: $(TOOLCHAIN_0113)/bin/python $(TOOLCHAIN_0114)/bin/python

# Three workers on this 2-core machine: the end-to-end and browser files
# spend much of their time waiting on the processes they started (a
# deployment's sweep used 0.6 of a core), so a third worker fills the idle
# core. A test file stays on one worker (--dist loadfile), so its
# module-scoped set-up (a sandbox batch, a deployment, a browser) runs once.
# Files are handed out in the order tests/conftest.py sorts them, slowest
# first (xdist's own order is by number of tests). The 20 slowest tests are
# printed last.
XDIST ?= -n 3 --dist loadfile --no-loadscope-reorder
# Every process of the suite, and what it starts, runs torch on one thread:
# three workers and their children already fill two cores, and torch's
# other threads only spin there (tests/harness/test_distributions.py and
# test_library_cpu.py: 62.5 s with torch's default, 41.7 s with one thread,
# under load). A value in the environment is kept.
OMP_NUM_THREADS ?= 1
test: export OMP_NUM_THREADS := $(OMP_NUM_THREADS)
test: install toolchains
	$(PY) -m pytest $(XDIST) --durations=20 $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf var/db.sqlite3 var/broker
