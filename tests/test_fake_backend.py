"""A third backend is one object and one ``register`` call (issue 28): a fake placement
(tests/fake_backend.py) runs a real two-rank script run, and ``ddptui show``, ``ddptui ps`` and ``ddptui kill``
reach it through the same ``Backend`` interface as the local and Slurm runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.backends import registry
from engine.core.backends.registry import LOCAL, backend_called, backend_of
from engine.core.common.statuses import ProcessRole
from engine.core.config.schema import RunConfig, ScriptConfig
from engine.core.config.toml_io import apply_overrides
from engine.core.host.gpus import GpuInventory
from engine.core.jobs.process_table import scan_processes
from engine.core.runs.run_info import Placement
from engine.core.runs.rundir import RunDir
from tests.fake_backend import FakeBackend
from tests.fixtures.live_runs import _ranks_named, run_processes
from tests.fixtures.waiting import wait_for

SLEEPER = "import time\nwhile True:\n    time.sleep(0.5)\n"


@pytest.fixture
def fake() -> Iterator[FakeBackend]:
    backend = FakeBackend()
    registry.register(backend)
    yield backend
    registry.unregister(backend)


def test_a_registered_backend_is_found_by_name_and_a_second_of_its_name_is_refused(
    fake: FakeBackend,
) -> None:
    assert backend_called("fake") is fake
    with pytest.raises(ValueError, match="a backend named 'fake' is registered already"):
        registry.register(FakeBackend())
    registry.unregister(fake)
    with pytest.raises(ValueError, match=r"no backend named 'fake' \(known: local, slurm\)"):
        backend_called("fake")
    registry.register(fake)  # the fixture unregisters it


def test_run_show_and_kill_go_through_the_fake_backend(
    fake: FakeBackend, tmp_path: Path, runs_dir: Path, run_reaper: None
) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER, encoding="utf-8")
    config = apply_overrides(
        RunConfig.for_script(ScriptConfig(path=str(script))), {"devices.spec": "cpu:2"}
    )
    started = fake.start(config, runs_dir)
    run_dir = RunDir(runs_dir / started.run_id)
    assert wait_for(lambda: _ranks_named(run_dir), timeout=30), "run.json never named its ranks"
    # the launcher kept the fake's own keys when it wrote run.json over
    written = json.loads(run_dir.run_json_path.read_text(encoding="utf-8"))
    assert written["placement"] == {"backend": "fake", "slot": "bench-7"}
    assert backend_of(run_dir) is fake
    info = run_dir.read_run_info()
    assert info.launcher is not None
    assert fake.locate(run_dir, info) == ((None, info.launcher), *info.ranked())
    # `ddptui ps` names the launcher and each rank from the fake's locate()
    table = scan_processes(gpus=GpuInventory(error="no GPU in this test"), cpu_interval=0.0)
    job = next(j for j in table.jobs if j.run_id == started.run_id)
    roles = sorted((p.role, p.rank) for p in job.processes)
    assert roles == [(ProcessRole.LAUNCHER, None), (ProcessRole.RANK, 0), (ProcessRole.RANK, 1)]
    registry.unregister(fake)
    assert backend_of(run_dir) is LOCAL  # an unknown placement's run is this machine's
    registry.register(fake)

    shown = CliRunner().invoke(
        main, ["show", started.run_id, "--runs-dir", str(runs_dir), "--json"]
    )
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["state"] == "running"

    told = CliRunner().invoke(main, ["show", started.run_id, "--runs-dir", str(runs_dir)])
    assert told.exit_code == 0, told.output
    assert (
        "\nplacement  fake, slot bench-7\n" in told.stdout
    )  # the fake's describe(), after created
    assert told.stdout.index("created ") < told.stdout.index("placement  fake")

    killed = CliRunner().invoke(
        main, ["kill", started.run_id, "--yes", "--grace", "5", "--runs-dir", str(runs_dir)]
    )
    assert killed.exit_code == 0, killed.output
    assert fake.asked == [("start", started.run_id), ("stop", started.run_id)]
    assert run_processes(run_dir) == []
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "killed"

    shown = CliRunner().invoke(
        main, ["show", started.run_id, "--runs-dir", str(runs_dir), "--json"]
    )
    assert json.loads(shown.stdout)["state"] == "killed"
    assert run_dir.read_run_info().placement == Placement("fake", {"slot": fake.slot})
