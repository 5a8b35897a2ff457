# The two set-up commands (README): `make demo` and `make test`.
# Each creates .venv from pyproject.toml by itself on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp-install

.PHONY: demo test lint venv clean constraints

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/ichord demo

# PYTEST_WORKERS: pytest-xdist workers, 3 by default on any machine (most of the suite waits on simulated
# reboots, settles and daemon subprocesses rather than computing, so 3 workers beat 2 on 2 cores: README);
# `make test PYTEST_WORKERS=0` runs it serially in one process, `auto` is one worker per core. A test that must share a
# server would say so with an xdist_group, which --dist loadgroup keeps on one worker (none needs one today).
PYTEST_WORKERS ?= 3

test: $(STAMP)
	$(BIN)/ruff check ichord tests scripts
	$(BIN)/mypy
	scripts/with_tools.sh $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# No `ruff format --check`: the code's layout (continuation lines aligned with the opening bracket, one-line
# guard clauses, tables laid out by hand) is deliberate and is not ruff format's; reformatting ~300 files
# would rewrite every line's history for no change in behaviour. ruff check enforces the rules that matter.
lint: $(STAMP)
	$(BIN)/ruff check ichord tests scripts
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Re-resolve the pins from pyproject.toml in a throw-away venv (run after changing a dependency).
constraints:
	rm -rf .venv-constraints
	$(PYTHON) -m venv .venv-constraints
	.venv-constraints/bin/python -m pip install --quiet --upgrade pip
	.venv-constraints/bin/python -m pip install --quiet -e '.[test]'
	{ sed -n '1,2p' constraints.txt; .venv-constraints/bin/python -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .venv-constraints
