# One venv, one source of truth: every target below runs inside .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The whole development install (make install, test, lint, bench): every extra,
# PyTorch's CPU build, the RL frameworks the integrations are tested against.
STAMP := $(VENV)/.installed
# What `make demo` needs and nothing more: the stack and its simulated GPU
# (the `server` extra), no PyTorch, no RL framework. README.md has the sizes.
DEMO_STAMP := $(VENV)/.installed-demo
PROTO := proto/timeshare/v1/timeshare.proto proto/timeshare/v1/llmd_compat.proto

.PHONY: install proto demo test test-unit chromium lint bench clean

install: $(STAMP)

define new_venv
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "timeshare needs Python >= 3.11; run make PYTHON=python3.11 ...")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
endef

$(STAMP): pyproject.toml
	$(new_venv)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# A development install already holds the server extra.
$(DEMO_STAMP): pyproject.toml
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then touch $(DEMO_STAMP); exit 0; fi; \
	$(MAKE) --no-print-directory demo-install

.PHONY: demo-install
demo-install:
	$(new_venv)
	$(BIN)/python -m pip install --quiet -e '.[server]'
	touch $(DEMO_STAMP)

# The stubs in timeshare/v1 are committed (so every pip install has them); run this after
# changing a .proto, and commit the result: tests/integration/test_stubs.py fails while they differ.
proto: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grpc_tools.protoc -Iproto \
		--python_out=. --grpc_python_out=. \
		--mypy_out=. --mypy_grpc_out=. $(PROTO)
	touch timeshare/v1/__init__.py

demo: $(DEMO_STAMP)
	$(BIN)/timeshare demo

# Three test processes (most tests wait on stacks of processes more than they
# compute), each with its own Temporal dev server and workers, a test
# file to one of them at a time (module fixtures stay in one process), in the
# order of tests/conftest.py (its long files first), not by number of tests.
TEST_WORKERS ?= 3
test: install chromium
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# tests/unit alone: the scheduling core, policies, placement, parsers and
# models, with no process started (tests/unit/conftest.py fails a test that
# starts one); well under a minute in one process.
test-unit: install
	$(BIN)/python -m pytest -q -p no:xdist tests/unit

# Headless Chromium for the browser tests (pytest marker `browser`: the report, the
# Temporal UI): installed here with apt when this is root on Debian/Ubuntu and it is
# missing; elsewhere the tests are skipped and named in the suite's one-line skip
# summary. Never fails the build.
chromium:
	@test -x /usr/bin/chromium || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }; } || \
		echo "chromium: not installed (needs root and apt-get); its browser tests will be skipped"; }

# mypy through tests/typecheck.py: it names workflows/, activities/ and workers/
# by the packages they install as (timeshare.workflows, ...), which a plain `mypy` cannot.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m tests.typecheck

# The quick versions of the benchmarks (a few minutes on 2 cores); see docs/benchmarks.md.
bench: install
	$(BIN)/python -m bench handover --quick
	$(BIN)/python -m bench utilization --quick
	$(BIN)/python -m bench scale --quick
	$(BIN)/python -m bench handover --two-nodes --quick
	$(BIN)/python -m bench placement --quick

clean:
	rm -rf $(VENV) .timeshare .pytest_cache .mypy_cache .ruff_cache
