"""bench/ui_load.py keeps working: a short run shows all 8 ranks and reads their events. The 10 %
target is the bench's to report on a quiet machine (``python bench/ui_load.py --check``); here only
a gross regression fails (a shared test machine's CPU figures are noisy)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.fixtures.repo import REPO_ROOT


def test_ui_load_bench_runs_and_reports() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "bench/ui_load.py",
            "--seconds",
            "3",
            "--warmup",
            "1.5",
            "--json",
            "--no-baseline",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout)
    assert figures["ranks_shown"] == 8
    assert figures["events_read"] > 8 * 3 * 2  # at least half of the 4 a second per rank
    assert figures["cpu_percent_of_one_core"] < 50
