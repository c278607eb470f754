# Quick start: `make demo` (the main job end to end) and `make test` (the test suite).
# Every target and when to run it: CONTRIBUTING.md; measured times: docs/benchmarks.md.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sparkdp-ready
PYTEST_ARGS ?= --durations=20  # the slowest tests, to keep `make test` inside its time budget

.PHONY: setup demo test test-fast test-gpu typecheck test-all test-cluster-env test-multihost lint docs docs-serve fuzz bench bench-cluster bench-sync bench-allreduce bench-ps bench-ps-load bench-async bench-data bench-checkpoint bench-monitor bench-multihost bench-lm bench-finetune clean

$(STAMP): pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh
	touch $@

setup: $(STAMP)

# Fashion-MNIST, the classic 2-conv CNN, gradient all-reduce on 2 Spark workers, 2 epochs.
demo: $(STAMP)
	$(VENV)/bin/sparkdp train --dataset fashion-mnist --model cnn --strategy allreduce \
		--workers 2 --epochs 2 --lr 0.05 --out out/demo --json-out out/demo/summary.json

# pytest exits 5 when it collects nothing: treat that as a failure, never as a pass.
test: $(STAMP)
	@$(PY) -m pytest -m "not slow and not gpu and not multihost" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc = 5 ]; then echo "make test: pytest collected no tests - the suite is missing" >&2; exit 1; fi; \
	exit $$rc

# The inner loop: unit and threaded tests; nothing that starts a JVM (tests taking the spark
# fixture are marked spark by tests/conftest.py) or several processes (marked distributed).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not spark and not distributed and not e2e and not slow and not gpu and not multihost" $(PYTEST_ARGS)

# CUDA/NCCL tests: run them on a machine with a GPU (make test skips them).
test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

# Several machines on this one: the driver, a Spark Master and Workers each in a network namespace
# of its own (hostname, /etc/hosts, /dev/shm), on rate-limited links (tests/multihost/netbed.py).
# Needs root (skipped otherwise); about 10 minutes (docs/benchmarks.md); removes every namespace and
# process it made.
test-multihost: $(STAMP)
	$(PY) -m pytest -m multihost $(PYTEST_ARGS) tests/multihost

test-all: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# A venv-pack archive shipped to a standalone cluster whose executors lack torch and sparkdp
# (installs torch into a fresh venv and packs it: about 4 minutes, docs/benchmarks.md; not in make test).
test-cluster-env: $(STAMP)
	$(PY) -m pytest -m slow $(PYTEST_ARGS) tests/cli/test_packed_env.py

# The fuzz tests with 100,000 generated inputs each (make test runs 1,500 per parser target, 500 per decoder target).
fuzz: $(STAMP)
	SPARKDP_FUZZ_EXAMPLES=100000 $(PY) -m pytest -q tests/fuzz

# The user guide (MkDocs + Material + mkdocstrings) into site/; strict: a warning, a broken link,
# a missing example or an unresolved API reference fails the build.
docs: $(STAMP)
	@$(PY) -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null || { \
		echo "make docs: the documentation tools are not installed; run: $(VENV)/bin/pip install -e '.[docs]'" >&2; \
		exit 1; }
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean

docs-serve: docs
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples scripts
	$(PY) -m ruff format --check src tests benchmarks examples scripts

typecheck: $(STAMP)
	$(PY) -m mypy src/sparkdp

bench: bench-sync bench-allreduce bench-ps bench-async bench-data

bench-sync: $(STAMP)
	$(PY) benchmarks/sync_vs_torchdistributor.py

bench-allreduce: $(STAMP)
	$(PY) benchmarks/allreduce_transport.py

bench-ps: $(STAMP)
	$(PY) benchmarks/ps_bandwidth.py

# 32 client processes pushing and pulling a 1M-parameter model for 60 s against one server;
# fails if any acknowledged push is lost or doubled (PS_LOAD_CLIENTS=, PS_LOAD_SECONDS= to change).
PS_LOAD_CLIENTS ?= 32
PS_LOAD_SECONDS ?= 60
bench-ps-load: $(STAMP)
	$(PY) benchmarks/ps_load.py --clients $(PS_LOAD_CLIENTS) --seconds $(PS_LOAD_SECONDS)

bench-async: $(STAMP)
	$(PY) benchmarks/async_throughput.py

bench-checkpoint: $(STAMP)
	$(PY) benchmarks/checkpoint_cost.py

bench-cluster: $(STAMP)
	$(PY) benchmarks/standalone_vs_local.py

bench-monitor: $(STAMP)
	$(PY) benchmarks/monitor_cost.py

# allreduce, average(k=8) and asgd across namespace hosts at 1 Gbit/s and 100 Mbit/s per host
# (needs root; about 10 minutes; BENCH_MULTIHOST_ARGS= to change, e.g. --workers 2 4).
BENCH_MULTIHOST_ARGS ?=
bench-multihost: $(STAMP)
	$(PY) benchmarks/multihost.py $(BENCH_MULTIHOST_ARGS)

bench-data: $(STAMP)
	$(PY) benchmarks/data_throughput.py

# a small GPT's tokens/s on fortunes: sparkdp's strategies vs TorchDistributor vs one process
# (a few minutes a repeat; BENCH_LM_ARGS= to change, e.g. --repeats 3)
BENCH_LM_ARGS ?=
bench-lm: $(STAMP)
	$(PY) benchmarks/lm_tokens.py $(BENCH_LM_ARGS)

# a pretrained GPT-2's fine-tune tokens/s on fortunes: LoRA vs full, allreduce vs fsdp, beside
# TorchDistributor running the same loop and one process, fp32 and bf16-mixed; bytes per step and
# per checkpoint (16 child processes a repeat, 30-110 s each on a busy 2-core machine:
# docs/benchmarks.md; BENCH_FINETUNE_ARGS= to change, e.g. --repeats 3 or --precisions fp32)
BENCH_FINETUNE_ARGS ?=
bench-finetune: $(STAMP)
	$(PY) benchmarks/finetune_tokens.py $(BENCH_FINETUNE_ARGS)

clean:
	rm -rf out build dist src/*.egg-info .pytest_cache
