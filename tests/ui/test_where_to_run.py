"""The launch form's "where to run": this machine, or Slurm with a partition from ``sinfo``, nodes
and a time limit; the check under the form says what Slurm would be asked, or why not, and Start
submits to Slurm. The Runs screen shows a Slurm run's job id and Slurm's reason while it pends."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import Input, Select

from ddptui.app import DdptuiApp
from ddptui.screens.runs import RunsScreen
from ddptui.watch import RunListing
from ddptui.widgets.where_to_run import WhereToRun
from engine.core.backends.slurm.config import SlurmConfig
from engine.core.common.statuses import RunStatus
from engine.core.runs.placement import PlacementView
from tests.ui.standins import screen_text, settle
from tests.ui.test_launch_form import SMALL, actions, launch_screen

pytestmark = pytest.mark.asyncio


async def test_slurm_is_where_the_form_says_with_partition_nodes_and_time(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    actions(app).partitions = [("debug", True, 2, "infinite"), ("long", False, 4, "2-00:00:00")]
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await launch_screen(pilot, app)
        where = screen.query_one(WhereToRun)
        assert not where.query_one("#slurm-fields").display  # this machine: no Slurm fields
        where.query_one("#where", Select).value = "slurm"
        await settle(pilot, lambda: len(where.offered) == 3)
        assert where.query_one("#slurm-fields").display
        assert [label for label, _ in where.offered] == [
            "(its default)",
            "debug* (2 nodes, infinite)",
            "long (4 nodes, 2-00:00:00)",
        ]
        where.query_one("#partition", Select).value = "long"
        where.query_one("#nodes", Input).value = "3"
        where.query_one("#time-limit", Input).value = "30"
        screen.query_one("#cpu-ranks", Input).value = "1"
        await settle(
            pilot, lambda: screen.form_check is not None and screen.form_check.where == "slurm"
        )
        said = screen_text(app)
        assert "submits to Slurm: 3 nodes × cpu:1, 3 ranks" in said
        assert "partition long, time limit 30" in said
        await pilot.press("s")
        await settle(pilot, lambda: bool(actions(app).started))
        (config,) = actions(app).started
        assert actions(app).where == ["slurm"]
        slurm = SlurmConfig.of(config)
        assert (slurm.partition, slurm.nodes, slurm.time) == ("long", 3, "30")
        assert config.devices.spec == "cpu:1"  # each node's devices


async def test_what_slurm_refuses_is_said_under_the_form(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    actions(app).partitions = [("debug", True, 2, "infinite")]
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        where = screen.query_one(WhereToRun)
        where.query_one("#where", Select).value = "slurm"
        where.query_one("#nodes", Input).value = "5"
        await settle(pilot, lambda: screen.problem.startswith("--nodes 5"))
        assert screen.problem == "--nodes 5: partition debug has 2 node(s)"
        await pilot.press("s")
        await settle(pilot)
        assert actions(app).started == []
        actions(app).partitions = None  # no Slurm on this machine
        where.query_one("#nodes", Input).value = "1"
        await settle(pilot, lambda: "not on PATH" in screen.problem)


async def test_the_runs_screen_shows_a_slurm_runs_job_and_why_it_pends(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    app = make_app()
    pending = RunListing(
        run_id="20261205-120000-cpu-demo-abcd",
        path=tmp_path,
        preset="cpu-demo",
        status=RunStatus.PENDING,
        devices="cpu:1 on 2 nodes",
        created=time.time(),
        elapsed=None,
        placement=PlacementView("slurm", label="job 4242", waiting_for="Resources"),
    )
    async with app.run_test(size=(120, 30)) as pilot:
        app.action_show("runs")
        await settle(pilot, lambda: isinstance(app.screen, RunsScreen))
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        from ddptui.messages import RunsListed

        screen.on_runs_listed(RunsListed([pending]))
        await settle(pilot)
        said = screen_text(app)
        assert "pending (Resources)" in said
        assert "cpu:1 on 2 nodes · job 4242" in said


async def test_the_run_screen_of_a_slurm_run_shows_each_ranks_node_and_each_nodes_gpus(
    make_app: Callable[..., DdptuiApp], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.core.backends.slurm import state
    from engine.core.backends.slurm.jobs import JobLookup, JobState, SlurmJob
    from engine.core.backends.slurm.records import write_node_record
    from engine.core.runs.events import EventWriter, RankStarted, StepProgress
    from tests.fixtures.slurm_runs import JOB, no_gpus, node_record, slurm_run
    from tests.ui.standins import NOW

    running = SlurmJob(job_id=JOB, state=JobState.RUNNING, nodes=("n1", "n2"))
    monkeypatch.setattr(state, "read_job", lambda _job: JobLookup(running))
    runs = tmp_path / "runs"
    run_dir = slurm_run(runs, created=NOW - 30)
    for index, node in enumerate(("n1", "n2")):
        write_node_record(run_dir.path, node_record(node, index, RunStatus.RUNNING))
        no_gpus(run_dir, node, NOW - 1)
        with EventWriter(run_dir.rank_events_path(index)) as w:
            w.write(RankStarted(rank=index, world_size=2, pid=100 + index, host="vm",
                                device="cpu", time=NOW - 20))  # fmt: skip
            w.write(StepProgress(rank=index, epoch=0, step=3, steps=10, global_step=3, loss=2.3,
                                 images_per_s=900.0, step_seconds=0.1, lr=0.05,
                                 time=NOW - 1))  # fmt: skip
    app = make_app(runs)
    async with app.run_test(size=(100, 30)) as pilot:
        app.open_run(run_dir)
        await settle(pilot, lambda: "GPUs of each node" in screen_text(app))
        said = screen_text(app)
        assert "running · cpu:1 on 2 nodes" in said and f"job {JOB} on n1, n2" in said
        rows = [line for line in said.splitlines() if "3/10" in line]
        assert len(rows) == 2 and " n1 " in rows[0] and " n2 " in rows[1], rows
        assert "n1        no GPU: NVML Shared Library Not Found" in said
        await pilot.press("f")  # folded: a line per node
        await settle(pilot)
        folded = screen_text(app)
        assert "n1           1 ranks 0  1 running" in folded
        assert "n2           1 ranks 1  1 running" in folded
