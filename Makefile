# laneway: `make run` installs and runs the demo on the embedded stack;
# `make test` installs and runs lint, types, the docs build and the whole test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install run test lint docs bench up clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# llama-cpp-python builds from source once (~11 min on 2 cores); pip's wheel cache keeps it.
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/laneway demo

up: install
	$(BIN)/laneway up

lint: install
	$(BIN)/ruff check schemas streams workers tests docs/hooks
	$(BIN)/ruff format --check schemas streams workers tests docs/hooks
	$(BIN)/mypy
	$(BIN)/mypy docs/hooks

# The manual (mkdocs.yml): --strict turns a broken link or anchor into a failure.
# Its reference pages are generated from the code at build time; site/ is ignored.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# pytest exits 5 when it collects nothing; that is reported, not hidden.
test: lint docs
	$(BIN)/pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# `make bench BENCH_ARGS=--save` keeps the result file in benchmarks/results/mix/.
bench: install
	$(BIN)/laneway bench mix --embedded -n 120 $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info site
