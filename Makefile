# Common commands. `make app` and `make test` set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist), each on one torch thread (tests/conftest.py). Files stay whole on
# one worker, so their fixtures are built once; the files that drive the app server and the page
# go to one worker together (one server). A third worker was no faster on a 2-core box (14:24
# against 14:37) and made the page's timing races likelier.
WORKERS ?= 2
PYTEST := $(PY) -m pytest -q --dist loadfile --no-loadscope-reorder

.PHONY: setup app test test-fast test-recipe test-kernels lint format bench browser device-pack docs clean

$(STAMP): requirements.txt requirements-dev.txt scripts/setup.sh
	VENV=$(VENV) scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

app: setup  ## open the app on the embedded model (http://127.0.0.1:7860)
	$(PY) app.py

browser:
	scripts/ensure-chromium.sh

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: setup browser lint  ## the whole suite, slow tests included (what CI runs)
	$(PYTEST) -n $(WORKERS) -m "not recipe"

test-fast: setup  ## the fast tier: every rule once, every method through the registry (under 3 min)
	$(PYTEST) -n $(WORKERS) -m "not slow"

test-recipe: setup  ## the GPU recipe end to end here (4 min); run it when scripts/device or decoders/train change
	RECORD_RECIPE_STAMP=1 $(PYTEST) -n 0 -m recipe

test-kernels: setup  ## the fast tier on other kernel paths: no oneDNN packing, float32 drafts, transformers' sdpa
	DECODING_LAB_PACK=0 DECODING_LAB_DRAFT_BF16=0 DECODING_LAB_GQA=0 $(PYTEST) -n $(WORKERS) -m "not slow"

bench: setup  ## HumanEval first 20, 128 new tokens, every method and the transformers peers
	$(PY) -m decoders.bench

docs: setup  ## docs/METHODS.md from the methods' declarations (after adding or changing a method)
	$(PY) -m decoders.docs

device-pack: setup  ## pack the model and the corpora for a lent GPU (docs/GPU.md)
	PY=$(PY) scripts/device/pack.sh

clean:
	rm -rf $(VENV) runs test-artifacts .pytest_cache .ruff_cache
