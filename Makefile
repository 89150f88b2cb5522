# ds4deploy: the two set-up commands are `make deploy` and `make test`.
#   make deploy [RECIPE=cpu] [INVENTORY=ansible/inventories/local.yml]
#   make test                 lint, unit tests, end-to-end deploy + host/serving checks, teardown
#   make down | status | logs
#   make render               re-render compose/ from recipes/
#   make base-image           Debian bookworm base via debootstrap (no registry needed)
#   make bench-stack [COLD=1] packaging cost: deployed stack vs bare engine -> docs/benchmarks.md
#   make bench-verify         model verify vs the machine's limit (4 GiB in /tmp) -> docs/bench-verify.md
#   make bench [RECIPE=cpu] [PROFILE=smoke] [URL=.. KEY_FILE=..]  benchmark profile -> docs/bench/<recipe>/ (`ds4deploy bench profiles`)
#   make bench-harness [RECIPE=cpu] [REPEATS=6]  the harness vs `vllm bench serve` on the deployed stack -> docs/bench-harness.md
#   make bundle [RECIPE=cpu] [BUNDLE=dir]   air-gapped bundle: images, model, wheels, recipe
#   make deploy OFFLINE=<bundle>            deploy from a bundle alone, without network access
#   make deploy RECIPE=cpu-2node-tp INVENTORY=ansible/inventories/two-node-local.yml   two nodes (workers first)
#   make bench-multinode      time to healthy (1 and 2 nodes), recovery from a killed worker -> docs/benchmarks.md
#   make check INVENTORY=<file> [RECIPE=cpu] [CHECKS=host,rails,fabric] [LIMIT=hosts|groups]  one table per host
#   make test-hosts           provision two netns test hosts (GX10 rails), rail checks, injected faults,
#                             each node's RoCE v2 GID index in its .env (fixture GID tables)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

RECIPE ?= cpu
INVENTORY ?= ansible/inventories/local.yml
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ANSIBLE_ENV := ANSIBLE_CONFIG=ansible/ansible.cfg ANSIBLE_FORCE_COLOR=$(if $(CI),0,1)
# Air-gapped: OFFLINE=<bundle dir> makes the venv from the bundle's wheelhouse (pip --no-index) and deploys from it.
OFFLINE ?=
BUNDLE ?= dist/ds4deploy-$(RECIPE)-bundle
PIP_SOURCE := $(if $(OFFLINE),--no-index --find-links $(abspath $(OFFLINE))/wheelhouse)
comma := ,
VENV_EXTRAS := $(if $(OFFLINE),deploy,deploy$(comma)dev)

.PHONY: help venv deploy down status logs render lint unit e2e test base-image bench-stack bench-verify bench bench-harness bench-multinode bundle clean check test-hosts

help:
	@sed -n '/^[^#]/q;s/^# \{0,1\}//;p' Makefile

# The control-host toolchain: ds4deploy itself, Ansible with community.docker, linters, testinfra.
$(BIN)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; fix: install Python 3.11+"; exit 2; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(PIP_SOURCE) --upgrade pip
	$(BIN)/pip install --quiet $(PIP_SOURCE) -e '.[$(VENV_EXTRAS)]'
	@touch $@

venv: $(BIN)/.installed

# The recipe checks run here first so a bad recipe stops with the CLI's own two-line message before any Ansible
# output; site.yml repeats them for users who call ansible-playbook directly.
deploy: venv
	@$(BIN)/ds4deploy recipe validate $(RECIPE) >/dev/null && $(BIN)/ds4deploy render --check $(RECIPE) >/dev/null
	@out=$$($(BIN)/ds4deploy preflight $(RECIPE) $(if $(filter-out ansible/inventories/local.yml,$(INVENTORY)),--inventory $(INVENTORY))) \
	  || { echo "$$out"; exit 1; }
	$(if $(OFFLINE),@$(BIN)/ds4deploy bundle verify $(OFFLINE) $(RECIPE) >/dev/null && echo "bundle verified: $(OFFLINE)")
	$(ANSIBLE_ENV) $(BIN)/ansible-playbook -i $(INVENTORY) ansible/site.yml -e recipe=$(RECIPE) \
	  $(if $(OFFLINE),-e ds4_offline_bundle=$(abspath $(OFFLINE)))
	@$(BIN)/ds4deploy summary $(RECIPE)

down: venv
	$(ANSIBLE_ENV) $(BIN)/ansible-playbook -i $(INVENTORY) ansible/down.yml -e recipe=$(RECIPE)

# Every node of the recipe: containers, /health on the head; `make logs [LINES=200]` adds each node's log tail.
status: venv
	@$(ANSIBLE_ENV) $(BIN)/ansible-playbook -i $(INVENTORY) ansible/status.yml -e recipe=$(RECIPE)

logs: venv
	@$(ANSIBLE_ENV) $(BIN)/ansible-playbook -i $(INVENTORY) ansible/status.yml -e recipe=$(RECIPE) \
	  -e stack_logs=$(or $(LINES),200)

render: venv
	$(BIN)/ds4deploy render

lint: venv
	$(BIN)/ruff check ds4deploy tests images
	$(BIN)/yamllint -s .
	cd ansible && ANSIBLE_CONFIG=ansible.cfg ../$(BIN)/ansible-lint --profile production --offline site.yml down.yml restart.yml status.yml nodes-plan.yml nodes-start.yml nodes-stop.yml roles
	$(BIN)/hadolint images/*/Dockerfile
	$(BIN)/ds4deploy render --check
	@# Multi-node renders need per-node launch facts; example values stand in for the check.
	@for f in compose/*/compose*.yaml; do \
	  DS4_SECRETS_ENV=/dev/null DS4_NODE_RANK=0 DS4_MASTER_ADDR=192.0.2.1 DS4_HOST_IP=192.0.2.1 \
	  DS4_NCCL_IB_GID_INDEX=3 $(BIN)/docker-compose -f $$f config --quiet && echo "compose config ok: $$f"; done

# vLLM's own argument parser (from the CPU build) checks every recipe's rendered engine argv.
ENGINE_VENV := .cache/engine-venv
$(ENGINE_VENV)/.pins: recipes/cpu.yaml | venv
	$(BIN)/ds4deploy engine-venv --recipe cpu

# tcpdump: the live packet-capture test of bench/wire.py (skipped without it, or without root).
unit: venv $(ENGINE_VENV)/.pins
	@command -v tcpdump >/dev/null || [ "$$(id -u)" != 0 ] || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tcpdump; }
	$(BIN)/pytest -q tests/unit

# Deploys for real, checks the host and the server with testinfra, tries the bad-input paths, tears down; then
# (cpu recipe) makes a bundle and deploys it again from a fresh copy with the network blocked (tests/offline), and
# deploys the two-node stack, breaks it three ways under the supervisor and starts a head alone (tests/multinode).
e2e: venv
	$(MAKE) deploy RECIPE=$(RECIPE) INVENTORY=$(INVENTORY)
	status=0; \
	DS4_RECIPE=$(RECIPE) PATH=$(abspath $(BIN)):$$PATH $(BIN)/pytest -q tests/infra --hosts=ansible://all --ansible-inventory $(INVENTORY) || status=$$?; \
	[ $$status -ne 0 ] || $(BIN)/pytest -q tests/e2e || status=$$?; \
	$(MAKE) down RECIPE=$(RECIPE) INVENTORY=$(INVENTORY) || status=$$?; \
	[ $$status -ne 0 ] || [ "$(RECIPE)" != cpu ] || $(BIN)/pytest -q tests/offline || status=$$?; \
	[ $$status -ne 0 ] || [ "$(RECIPE)" != cpu ] || $(BIN)/pytest -q tests/multinode || status=$$?; \
	exit $$status

test: lint unit e2e test-hosts

base-image:
	images/base/build-base.sh

# Time to healthy for one and two nodes and recovery from a killed worker -> docs/benchmarks.md (image built first).
bench-multinode: venv
	REPEATS=$(or $(REPEATS),2) $(BIN)/python -m ds4deploy.bench.multinode

bundle: venv
	$(BIN)/ds4deploy bundle create $(RECIPE) --dest $(BUNDLE)

bench-stack: venv
	$(BIN)/ds4deploy bench-stack --recipe $(RECIPE) $(if $(COLD),--cold)

# The harness against `vllm bench serve` on the deployed stack (make deploy first) -> docs/bench-harness.{md,json}.
bench-harness: venv
	$(BIN)/python -m ds4deploy.bench.trust --recipe $(RECIPE) $(if $(URL),--url $(URL)) \
	  $(if $(KEY_FILE),--key-file $(KEY_FILE)) $(if $(REPEATS),--repeats $(REPEATS))

# Creates 8 x 512 MiB in /tmp (removed after); drops the page cache for cold runs when allowed (root).
bench-verify: venv
	$(BIN)/python -m ds4deploy.bench_verify

PROFILE ?= smoke
bench: venv
	$(BIN)/ds4deploy bench run $(RECIPE) --profile $(PROFILE) --out docs/bench/$(RECIPE) $(if $(URL),--url $(URL)) \
	  $(if $(KEY_FILE),--key-file $(KEY_FILE))

# Host, rails and fabric checks of provisioned nodes: exit 0 all passed (skips say why), 1 a check failed,
# 2 a check could not run.
CHECKS ?= host,rails,fabric
LIMIT ?=
check: venv
	$(BIN)/ds4deploy check run --recipe $(RECIPE) --inventory $(INVENTORY) --groups $(CHECKS) $(if $(LIMIT),--limit $(LIMIT))

# Two network namespaces with veth rails stand in for two GX10 nodes: provision.yml's rails role, the rail checks,
# injected faults and bad input (tests/hosts; needs root). Namespaces are removed even when a test fails.
# tests/hosts/test_gid_launch_env.py resolves DS4_NCCL_IB_GID_INDEX per node (preflight role) and writes it into
# the .env (stack role) with ansible-playbook on localhost against fixture GID tables (no namespaces).
test-hosts: venv
	@command -v netplan >/dev/null && command -v ping >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends netplan.io iputils-ping; }
	$(BIN)/pytest -q tests/hosts

clean:
	rm -rf .cache build *.egg-info
