# The README's two commands: `make demo` (the main job) and `make test` (the suite).
# Both create the virtual environment first; nothing is installed by hand.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
RUN ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: demo test venv clean bench

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=23"
	$(BIN)/python -m pip install --quiet -e '.[test,serve,export]'
	rm -f $(VENV)/.installed-* && touch $@

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2  # two workers on the two cores

# Train the default recipe on the default data ($$FOODVIT_DATA, else the course's zip), evaluate it
# on the test split, and predict the first test photo.
demo: $(STAMP)
	$(BIN)/foodvit train --out $(RUN)
	$(BIN)/foodvit evaluate $(RUN)
	data=$$($(BIN)/foodvit data --print-path) && \
	  photo=$$(find "$$data/test" -type f -iname '*.jp*g' | sort | head -n 1) && \
	  $(BIN)/foodvit predict $(RUN) "$$photo" --plot $(RUN)/prediction.png
	@echo "Report: $(RUN)/report.md  (prediction: $(RUN)/prediction.png)"

clean:
	rm -rf $(VENV) runs .pytest_cache
