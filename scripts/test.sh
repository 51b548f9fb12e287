#!/usr/bin/env bash
# Create .venv if needed, install ddptui with its test extras, then lint, type-check, check the
# import boundaries (lint-imports) and run every test (the slow multi-process ones included).
# README.md's second quick-start command.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet -e '.[test]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/pytest -q "$@"
