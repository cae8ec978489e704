# The README's commands: `make demo` (the main job), `make test` (the suite) and `make lint`.
# Both create the virtual environment first; nothing is installed by hand.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HASH := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# installed: the package and its own dependencies (what `make demo` needs); then the extras the suite, lint and the
# docs use: every one but the notebook's JupyterLab (and onnx, which export includes)
CORE := $(VENV)/.core-$(HASH)
STAMP := $(VENV)/.installed-$(HASH)
RUN ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: demo test test-fast lint ruff venv clean bench notebook docs docs-serve ort-web

venv: $(STAMP)

# (a venv that already has everything for this pyproject.toml has the package too: nothing to install)
$(CORE): pyproject.toml
	if [ ! -e $(STAMP) ]; then \
	  $(PYTHON) -m venv $(VENV) && \
	  $(BIN)/python -m pip install --quiet --no-cache-dir --upgrade "pip>=23" && \
	  $(BIN)/python -m pip install --quiet --no-cache-dir -e .; \
	fi
	rm -f $(VENV)/.core-* && touch $@

$(STAMP): pyproject.toml | $(CORE)
	$(BIN)/python -m pip install --quiet --no-cache-dir -e '.[test,lint,serve,export,track,tune,timm,docs]'
	rm -f $(VENV)/.installed-* && touch $@

# ruff first (a second), then the suite; mypy runs inside the suite (tests/test_architecture.py), so that its minute
# of one core overlaps the other tests.
test: ruff
	$(BIN)/python -m pytest -q -n 2 --dist worksteal  # two workers on the two cores; one that runs out takes queued tests from the other

# ruff (lint, then the formatter as a check: it changes nothing) over the code, the tests, the benchmarks and the
# documentation's scripts; `make lint` adds mypy over src/, as configured in pyproject.toml.
LINTED := src tests bench docs
ruff: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

lint: ruff
	$(BIN)/mypy

# The inner loop: the suite without the tests marked slow (torchrun, the browser, kill -9, servers, ViT-B/16 at full
# size, mypy) and without ruff; every module is still exercised. `make test` stays the one that counts.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow"

# Train the default recipe on the default data ($$FOODVIT_DATA, else the course's zip), evaluate it
# on the test split, and predict the first test photo. It needs none of the extras, so a first run installs
# the package alone (about 40 s less than everything here).
demo: $(CORE)
	$(BIN)/foodvit train --out $(RUN)
	$(BIN)/foodvit evaluate $(RUN)
	data=$$($(BIN)/foodvit data --print-path) && \
	  photo=$$(find "$$data/test" -type f -iname '*.jp*g' | sort | head -n 1) && \
	  $(BIN)/foodvit predict $(RUN) "$$photo" --plot $(RUN)/prediction.png
	@echo "Report: $(RUN)/report.md  (prediction: $(RUN)/prediction.png)"

# Rebuild docs/walkthrough.ipynb from docs/build_walkthrough.py, execute it top to bottom and save
# its outputs (the suite checks that the committed outputs are current).
notebook: $(STAMP)
	$(BIN)/python docs/build_walkthrough.py
	$(BIN)/python -c "import nbformat, nbclient; p = 'docs/walkthrough.ipynb'; nb = nbformat.read(p, as_version=4); \
	  nbclient.NotebookClient(nb, timeout=600, kernel_name='python3', resources={'metadata': {'path': 'docs'}}).execute(); \
	  nbformat.write(nb, p)"

# The documentation site: MkDocs builds site/, its generated pages (the Results page, the home page's figures, the
# command-line and recipe references) made in memory from results/ and the code by docs/generate.py through
# docs/hooks.py, so the build writes nothing else (--strict: a broken link, a missing reference or a page left out of
# the navigation fails the build). `python docs/generate.py` rewrites the committed generated text.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

# ONNX Runtime Web's npm package, the pinned version export-web uses, for the page's browser test
# (tests/test_web_browser.py); npm checks the registry's integrity hash, export-web checks it again.
ORT_WEB_VERSION := $(shell sed -n 's/^VERSION = "\(.*\)"/\1/p' src/foodvit/deploy/web/runtime.py)
ort-web: .cache/npm/onnxruntime-web-$(ORT_WEB_VERSION).tgz

.cache/npm/onnxruntime-web-$(ORT_WEB_VERSION).tgz:
	mkdir -p .cache/npm && cd .cache/npm && npm pack --silent onnxruntime-web@$(ORT_WEB_VERSION) >/dev/null

clean:
	rm -rf $(VENV) runs site .pytest_cache
