"""The recorded runs every UI test reads (tests/fixtures/recorded-run) are exactly what their
generator writes today: regenerated into a temporary directory, every file is byte for byte the
committed one, and no file is missing or extra. A change to the event schema, the config or the
summary fails here until the fixture is regenerated (``python tests/fixtures/make_recorded_run.py``)
and the snapshot diffs are reviewed."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures import make_recorded_run
from tests.fixtures.repo import REPO_ROOT

COMMITTED = REPO_ROOT / "tests" / "fixtures" / "recorded-run"


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_committed_recorded_runs_are_what_the_generator_writes(tmp_path: Path) -> None:
    fresh = tmp_path / "recorded-run"
    make_recorded_run.write_recorded_runs(fresh)
    written, committed = files_under(fresh), files_under(COMMITTED)
    assert sorted(written) == sorted(committed)
    assert len(committed) >= 20  # three runs: config, run.json, events, logs, summaries
    differ = [name for name in sorted(written) if written[name] != committed[name]]
    assert differ == [], f"regenerate tests/fixtures/recorded-run: {differ} differ"
