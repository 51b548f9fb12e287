"""A third backend is one object and one ``register`` call (issue 28): a fake placement
(tests/fake_backend.py) runs a real two-rank script run, and ``ddptui show``, ``ddptui runs``,
``ddptui ps`` and ``ddptui kill`` reach it through the same ``Backend`` interface as the local and
Slurm runs; the run observer asks its watch where the run is (pending with its reason, how it
ended, each rank's node) without knowing which backend it is; a backend's own config section is
read, checked and written by the config without the config naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.backends import registry
from engine.core.backends.registry import LOCAL, backend_called, backend_of
from engine.core.common.run_files import write_atomic
from engine.core.common.statuses import ProcessRole, RunStatus
from engine.core.config.schema import RunConfig, ScriptConfig
from engine.core.config.toml_io import apply_overrides
from engine.core.host.gpus import GpuInventory
from engine.core.jobs.process_table import scan_processes
from engine.core.runs.observer import RunObserver
from engine.core.runs.placement import Placement, watch_for
from engine.core.runs.rundir import RunDir, RunInfo
from engine.core.runs.settle import settle_observed
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
    assert watch_for(info) is None  # and the observer decides it as one of this machine's
    registry.register(fake)
    assert watch_for(info) is fake

    # the fake's "scheduler" holds the run back: every reader says so, through its watch
    fake.waiting_for = "slot bench-7, which another run holds"
    shown = CliRunner().invoke(
        main, ["show", started.run_id, "--runs-dir", str(runs_dir), "--json"]
    )
    said = json.loads(shown.stdout)
    assert (said["state"], said["reason"]) == (
        "pending",
        "waiting for slot bench-7, which another run holds",
    )
    assert said["placement"] == {
        "backend": "fake",
        "label": "slot bench-7",
        "waiting_for": "slot bench-7, which another run holds",
        "across_nodes": False,
        "slot": "bench-7",
    }
    assert [r["node"] for r in said["ranks"]] == ["fake-bench-7", "fake-bench-7"]
    told = CliRunner().invoke(main, ["show", started.run_id, "--runs-dir", str(runs_dir)])
    assert "\nstate      pending" in told.stdout
    assert ": waiting for slot bench-7, which another run holds\n" in told.stdout
    listed = CliRunner().invoke(main, ["runs", "--runs-dir", str(runs_dir), "--json"])
    (line,) = json.loads(listed.stdout)
    assert (line["state"], line["placement"]["label"]) == ("pending", "slot bench-7")
    fake.waiting_for = ""  # let go: its launcher here decides again

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


def test_a_backend_that_ends_its_run_settles_it_through_the_observer(
    fake: FakeBackend, runs_dir: Path
) -> None:
    """No launcher ever recorded itself (this machine's rules would say lost), but the fake's
    watch says how the run ended: that is the run's end, its summary written once through the
    fake, and where it was is read back from the run directory once it has ended."""
    run_dir = RunDir(runs_dir / "20261205-120000-cpu-demo-fake")
    run_dir.create()
    write_atomic(run_dir.config_path, 'name = "cpu-demo"\n')
    begun = RunInfo.begun(run_dir.run_id, "cpu-demo", world_size=2, devices="cpu:2")
    run_dir.write_run_info(replace(begun, placement=Placement("fake", {"slot": "bench-9"})))
    observer = RunObserver(run_dir)
    fake.waiting_for = "slot bench-9"
    assert observer.observe().status == RunStatus.PENDING
    fake.ended_as = (RunStatus.TIMEOUT, "slot bench-9's time ran out")
    ended = observer.observe()
    assert (ended.status, ended.reason) == (RunStatus.TIMEOUT, "slot bench-9's time ran out")
    assert ended.placement is not None and ended.placement.label == "slot bench-9"
    assert run_dir.read_summary() is None  # decided, not written: the observer never writes
    settle_observed(observer.observe())  # the caller who asks writes it down
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.TIMEOUT


def test_a_backends_own_config_section_is_read_checked_and_written_by_the_config(
    tmp_path: Path,
) -> None:
    """A third backend's ``[fake]`` section: one ``register_section`` and the config reads it
    into the backend's type, overrides it, refuses an unknown key of it in one sentence naming
    the key and the file, and writes it only when it asks something (the TOML round trip exact)."""
    from dataclasses import dataclass

    from engine.core.config.backend_sections import register_section, unregister_section
    from engine.core.config.schema import ConfigError
    from engine.core.config.toml_io import load_config, to_toml

    @dataclass(frozen=True)
    class FakeSection:
        slot: str = ""
        seats: int = 1

    register_section("fake", FakeSection)
    try:
        plain = RunConfig()
        assert "[fake]" not in to_toml(plain)  # nothing asked: config.toml as before
        asked = apply_overrides(plain, {"fake.slot": "bench-7", "fake.seats": 3})
        assert asked.backend_section("fake", FakeSection) == FakeSection("bench-7", 3)
        path = tmp_path / "asked.toml"
        path.write_text(to_toml(asked), encoding="utf-8")
        assert "[fake]" in path.read_text() and load_config(path) == asked
        path.write_text('name = "x"\n[fake]\nsloth = "b"\n', encoding="utf-8")
        with pytest.raises(ConfigError, match=r"fake\.sloth") as refused:
            load_config(path)
        assert str(path) in str(refused.value) and "\n" not in str(refused.value)
    finally:
        unregister_section("fake")


def test_a_backends_run_options_are_its_own_declared_as_data(fake: FakeBackend) -> None:
    """What a backend adds to ``ddptui run`` is the data it declares: its flag, the options that
    set its section, the lines that teach them; a backend's option without its flag is one
    sentence; Slurm's teach ``ddptui run --help`` as they always did."""
    import click

    from ddptui.backend_options import PlacementAsked, backend_options, teaching_lines
    from engine.core.backends.interface import RunOption, RunOptions
    from engine.core.config.schema import ConfigError

    fake.run_options = RunOptions(
        flag="--fake",
        help="Run on the fake.",
        options=(RunOption("--slot", "fake.slot", "The fake's slot."),),
        teaching=("On the fake, in a slot of its own:", "  ddptui run cpu-demo --fake --slot b7"),
    )
    asked: list[PlacementAsked] = []

    @click.command()
    @backend_options
    def command(placement: PlacementAsked) -> None:
        asked.append(placement)

    assert CliRunner().invoke(command, ["--fake", "--slot", "b7"]).exit_code == 0
    assert asked[-1].backend is fake and asked[-1].overrides() == {"fake.slot": "b7"}
    assert CliRunner().invoke(command, ["--slot", "b7"]).exit_code == 0
    with pytest.raises(ConfigError, match=r"^--slot needs --fake$"):
        asked[-1].overrides()
    assert CliRunner().invoke(command, []).exit_code == 0
    assert asked[-1].backend is LOCAL and asked[-1].overrides() == {}
    assert "  ddptui run cpu-demo --fake --slot b7" in teaching_lines()
    helped = CliRunner().invoke(main, ["run", "--help"], terminal_width=100).stdout
    assert "  ddptui run cpu-demo --slurm --nodes 2 --devices cpu:1\n" in helped
    assert "--sbatch KEY=VALUE" in helped and "Slurm nodes." in helped
