# Everything installs from nothing: virtual environment, Python packages, and Java (for PySpark) when the
# machine has no Java >= 17.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
JAVA_HOME_FILE := $(VENV)/java-home
PYTEST_ARGS ?=
# test processes (pytest-xdist): on 2 cores one test's JVM start, Spark batches and subprocess waits overlap another's;
# work stealing keeps both busy to the end (tests last from milliseconds to two minutes); the slowest are listed at the
# end (`make test` has 20 minutes on a 2-core machine: that list says where they go)
PYTEST_WORKERS ?= 2
PYTEST_DIST ?= worksteal

# Every pyspark minor version pyproject.toml allows, besides the newest (which `make test` runs on): a virtual
# environment each, and the Spark tests of the transport, placement and the transformWithState drop-in (and that
# the tests' Spark settings name this version's classes).
SMOKE_VERSIONS ?= 4.0 4.1 4.2
SMOKE_TESTS ?= tests/workshop/test_quick_settings.py tests/spark/test_spark_dropin.py tests/spark/test_spark_adapter.py tests/spark/test_spark_routing.py \
	tests/spark/test_spark_progress.py \
	tests/spark/test_spark_stream.py::test_counts_checkpoints_sink_and_rescale
# and on Spark Connect (a pytest process of their own, as in `make connect`); the restarts at other parallelisms on
# lmdb only (the heap table's run is the same transport, and `make connect` runs it)
SMOKE_CONNECT_TESTS ?= tests/connect/test_connect_stream.py tests/connect/test_connect_state.py tests/connect/test_connect_docs.py \
	--deselect "tests/connect/test_connect_stream.py::test_exactly_once_through_restarts_at_other_parallelisms[heap]"

.PHONY: demo test fast connect smoke smoke-venvs lint typecheck bench install java clean

install: $(STAMP)

# The packages install with uv (itself from pip, into the venv): in a clean clone on the 2-core machine, with empty
# caches, the venv took 38 s against pip's 85 s (2026-11-30), and the smoke's three 48 s (pip: 71 s, a session
# earlier). The venv keeps its pip for the user.
UV := $(VENV)/bin/uv
comma := ,
$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.11+ is required (python3.11 or python3 on PATH)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv
	$(UV) pip install -q --python $(PY) -e ".[spark,dev,bench,s3,connect]"
	touch $(STAMP)

java: $(JAVA_HOME_FILE)

$(JAVA_HOME_FILE): $(STAMP) tools/ensure_java.sh
	bash tools/ensure_java.sh $(VENV)

demo: $(STAMP) $(JAVA_HOME_FILE)
	JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $(VENV)/bin/spate demo

# The Spark drivers the tests start load their classes from an archive made once per venv, and run the quick JIT
# options (tests/helpers/jvm_archive.py, used by tests/conftest.py)
JVM_ARCHIVE := $(VENV)/spark-driver-classes.jsa
$(JVM_ARCHIVE): $(STAMP) $(JAVA_HOME_FILE) tests/helpers/jvm_archive.py
	JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $(PY) tests/helpers/jvm_archive.py $@

test: $(STAMP) $(JAVA_HOME_FILE) $(JVM_ARCHIVE)
	JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $(VENV)/bin/ruff check src tests
	$(VENV)/bin/mypy src
	JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist $(PYTEST_DIST) --durations=30 $(PYTEST_ARGS)

# The Spark Connect tests: a real Connect server on loopback, in a pytest process of its own (a Connect client
# session turns a whole Python process to Connect mode, so they never share one with the other Spark tests); one
# at a time: under the load of two, Spark's foreachBatch process can miss its hard-coded 10 s to connect back.
connect: $(STAMP) $(JAVA_HOME_FILE)
	JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $(PY) -m pytest -q -p no:cacheprovider --connect tests

# The inner loop: ruff, mypy and the tests that need no JVM (no Spark session, standalone cluster or workshop
# benchmark and campaign), a few minutes; `make test` runs everything before a commit is pushed.
fast: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/mypy src
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist $(PYTEST_DIST) -m "not spark" --ignore=tests/spark --ignore=tests/cluster \
	  --ignore=tests/workshop $(PYTEST_ARGS)

# The smoke's venvs, with the main venv's uv (its cache serves what they share): first the third-party packages of all
# of them at once (pyspark's source package is built in each, and one build leaves a core idle), then spate itself
# into each in turn (an editable install writes src/*.egg-info, which installs side by side would share).
SMOKE_EXTRAS := spark,test,connect
SMOKE_EXTRA_FLAGS := $(foreach e,$(subst $(comma), ,$(SMOKE_EXTRAS)),--extra $(e))
SMOKE_VENV_STALE = [ ! -f $$venv/.installed-stamp ] || [ pyproject.toml -nt $$venv/.installed-stamp ]
smoke-venvs: $(STAMP)
	@pids=""; for v in $(SMOKE_VERSIONS); do \
	  venv=.venv-pyspark-$$v; \
	  if $(SMOKE_VENV_STALE); then \
	    ( $(PYTHON) -m venv $$venv && $(UV) pip install -q --python $$venv/bin/python -r pyproject.toml \
	      $(SMOKE_EXTRA_FLAGS) "pyspark==$$v.*" ) & pids="$$pids $$!"; \
	  fi; \
	done; \
	failed=0; for p in $$pids; do wait $$p || failed=1; done; exit $$failed
	@for v in $(SMOKE_VERSIONS); do \
	  venv=.venv-pyspark-$$v; \
	  if $(SMOKE_VENV_STALE); then \
	    $(UV) pip install -q --python $$venv/bin/python -e ".[$(SMOKE_EXTRAS)]" "pyspark==$$v.*" && \
	    touch $$venv/.installed-stamp || exit 1; \
	  fi; \
	done

smoke: smoke-venvs $(JAVA_HOME_FILE)
	@for v in $(SMOKE_VERSIONS); do \
	  venv=.venv-pyspark-$$v; \
	  cp $(JAVA_HOME_FILE) $$venv/java-home; \
	  echo "== smoke: pyspark $$($$venv/bin/python -c 'import pyspark; print(pyspark.__version__)')"; \
	  JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $$venv/bin/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) \
	    $(SMOKE_TESTS) || exit 1; \
	  JAVA_HOME="$$(cat $(JAVA_HOME_FILE))" $$venv/bin/python -m pytest -q -p no:cacheprovider \
	    --connect $(SMOKE_CONNECT_TESTS) || exit 1; \
	done

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

typecheck: $(STAMP)
	$(VENV)/bin/mypy src

bench: $(STAMP)
	$(VENV)/bin/spate bench state --quick

clean:
	rm -rf $(VENV) .venv-pyspark-* .pytest_cache build *.egg-info src/*.egg-info
