# The README's two commands: `make demo` (the main job) and `make test` (the suite).
# Both create the virtual environment first; nothing is installed by hand.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
RUN ?= runs/demo

.PHONY: demo test venv clean bench

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=23"
	$(BIN)/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

test: $(STAMP)
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/foodvit train --out $(RUN)
	$(BIN)/foodvit evaluate $(RUN) --split test
	$(BIN)/foodvit predict $(RUN) --from-test 1 --plot $(RUN)/prediction.png
	@echo "Report: $(RUN)/report.md"

clean:
	rm -rf $(VENV) runs .pytest_cache
