# canonical_network: `make train` and `make test` set everything up on a fresh machine by themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make train` budget: CN(p16)-CNN on the embedded 5k Rotated MNIST, 12 epochs: 206 s on a fresh 2-core machine,
# the install included.
TRAIN_EXPERIMENT ?= rotmnist/cn_p16
TRAIN_EPOCHS ?= 12
ARGS ?=
# pytest-xdist workers for `make test`: the suite is mostly one thread at a time (subprocess runs, small
# models), so two workers use a 2-core machine's second core (each test file stays on one worker: its
# module fixtures are built once). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

.PHONY: help install system-deps train test test-full lint clean constraints

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

system-deps:  ## gfortran, needed to build escnn's dependency py3nj
	@if ! command -v gfortran >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo ">> installing gfortran (needed to build py3nj for escnn)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gfortran >/dev/null) || \
	      { echo "error: could not apt-get install gfortran; install a Fortran compiler and rerun" >&2; exit 1; }; \
	  else \
	    echo "error: gfortran is missing and cannot be installed automatically (needs root + apt-get)." >&2; \
	    echo "       Install a Fortran compiler (e.g. 'sudo apt-get install gfortran') and rerun." >&2; exit 1; \
	  fi; \
	fi

# The env is rebuilt when pyproject.toml or constraints.txt changes (the stamp is older) or when it is missing.
# constraints.txt pins the exact tested stack, so `make train` / `make test` install what CI tested;
# `pip install -e .` without it resolves pyproject.toml's ranges in an existing environment.
$(STAMP): pyproject.toml constraints.txt
	@$(MAKE) --no-print-directory system-deps
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)  ## create .venv and install the package with its dev tools

train: $(STAMP)  ## train CN(p16)-CNN on the embedded Rotated MNIST (override TRAIN_EPOCHS=, ARGS=)
	$(PY) -m canonical_network.train experiment=$(TRAIN_EXPERIMENT) trainer.max_epochs=$(TRAIN_EPOCHS) $(ARGS)

test: $(STAMP)  ## fast tests (slurm tests run when a local cluster is up: scripts/local_slurm.sh start)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(ARGS)

test-full: $(STAMP)  ## every test, the slow ones included
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "slow or not slow" $(ARGS)

lint: $(STAMP)  ## ruff
	$(VENV)/bin/ruff check canonical_network hydra_plugins tests scripts

constraints: $(STAMP)  ## rewrite constraints.txt from the installed env (after changing a dependency)
	@{ head -3 constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^canonical'; } > constraints.txt.new
	@mv constraints.txt.new constraints.txt && echo "constraints.txt: $$(grep -vc '^#' constraints.txt) pins"

clean:  ## remove the env and caches (outputs/ and data/ are kept)
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
