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

# PYTEST_WORKERS: pytest-xdist workers (`make test PYTEST_WORKERS=2`; `auto` is one per core); 0, the default,
# runs the suite serially in one process. Not parallel by default yet: at -n 2 on a loaded 2-core machine the
# integration tests whose Timing is scaled to 0.002-0.01 (an API call bound of 60-300 ms) time out (issue 32).
PYTEST_WORKERS ?= 0

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
