#!/usr/bin/env bash
# Create .venv if needed, install ddptui with its test extras, then lint, type-check, check the
# import boundaries (lint-imports) and run every test (the slow multi-process ones included), in
# two pytest-xdist workers ($DDPTUI_TEST_WORKERS for another number): most slow tests wait on
# processes and clocks rather than compute, and the Slurm tests share one worker and one cluster.
# README.md's second quick-start command.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet -e '.[test]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/pytest -q -n "${DDPTUI_TEST_WORKERS:-2}" --dist loadgroup "$@"
