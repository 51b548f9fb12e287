#!/usr/bin/env bash
# Create .venv if needed, install ddptui, and train the embedded default (cpu-demo: DDP on 2 CPU
# ranks, synthetic data, under a minute). README.md's first quick-start command.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet -e .
.venv/bin/ddptui run cpu-demo "$@"
