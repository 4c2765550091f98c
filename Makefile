# The two commands of the README: `make up` runs the whole product, `make test` runs the tests.
# Both create .venv on first use and reinstall only when pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV   := .venv
PIP    := $(VENV)/bin/pip install --disable-pip-version-check -q -c constraints.txt
BIN    := $(VENV)/bin
# The Kubernetes manifests' security scanner (checkov) pins boto3, packaging and networkx
# versions the project cannot use, so it lives in a virtual environment of its own.
SCANNER := .venv-checkov
CHECKOV := checkov==3.3.30

.PHONY: up test lint format readme

up: $(VENV)/.installed
	$(BIN)/kvgate up

test: $(VENV)/.installed-dev $(SCANNER)/.installed
	scripts/check-test-deps.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# README.md's settings table is generated from kvgate/settings.py; a test checks it is current.
readme: $(VENV)/.installed
	$(BIN)/python -m kvgate.settings_doc README.md

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q --upgrade pip

# torch goes in first and alone, pinned by constraints.txt to the CPU wheel, so that no
# later resolution ever pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) torch
	$(PIP) -e '.[bench]'
	touch $@

# The tests also load our HiCache backend through SGLang's own code: SGLang 0.5.23 with
# --no-deps plus the pure-Python modules its storage and server-args modules import.
$(VENV)/.installed-dev: $(VENV)/.installed scripts/install-sglang-test-deps.sh
	$(PIP) -e '.[dev,bench]'
	scripts/install-sglang-test-deps.sh $(VENV)
	touch $@

$(SCANNER)/.installed: Makefile
	$(PYTHON) -m venv $(SCANNER)
	$(SCANNER)/bin/pip install --disable-pip-version-check -q '$(CHECKOV)'
	touch $@
