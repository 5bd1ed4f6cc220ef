# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean browser sandbox

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The console's browser test drives Debian's chromium (Playwright downloads no browser):
# installed here when missing and this is root; otherwise that test says what to install.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] \
		&& (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium) \
		|| echo "chromium is missing: the console's browser test needs Debian's chromium"; }

# Uploaded controllers and code checks run in bubblewrap's sandbox (the server refuses
# uploaded controllers without it): installed here when missing and this is root.
sandbox:
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] \
		&& (apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap) \
		|| echo "bwrap is missing: uploaded controllers need Debian's bubblewrap"; }

demo: $(STAMP) sandbox
	$(BIN)/streampilot demo

test: $(STAMP) browser sandbox
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/hotkeys_overhead.py
	$(BIN)/python bench/reconfig.py --precopy-pause-ms 0 20
	$(BIN)/python bench/state_transfer.py --no-pool
	$(BIN)/python bench/fork_copy.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/spark.py
	$(BIN)/python bench/controllers.py
	$(BIN)/python bench/nexmark.py
	$(BIN)/python bench/connectors.py
	$(BIN)/python bench/report.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
