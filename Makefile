# Everything installs from nothing: virtual environment, Python packages, and Java (for PySpark) when the
# machine has no Java >= 17.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
JAVA_HOME_FILE := $(VENV)/java-home
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck bench install java clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.11+ is required (python3.11 or python3 on PATH)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[spark,dev,bench,s3]"
	touch $(STAMP)

java: $(JAVA_HOME_FILE)

$(JAVA_HOME_FILE): $(STAMP) tools/ensure_java.sh
	bash tools/ensure_java.sh $(VENV)

demo: $(STAMP) $(JAVA_HOME_FILE)
	JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $(VENV)/bin/spate demo

test: $(STAMP) $(JAVA_HOME_FILE)
	JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $(VENV)/bin/ruff check src tests
	JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

typecheck: $(STAMP)
	$(PY) -m pip install -q mypy
	$(VENV)/bin/mypy src --ignore-missing-imports

bench: $(STAMP)
	$(VENV)/bin/spate bench state --quick

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info src/*.egg-info
