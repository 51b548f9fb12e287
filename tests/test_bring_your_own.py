"""Your model and data in a preset (model.factory, data.factory) and your own torchrun-style script
(ddptui run script.py / -m module), on real gloo runs: they train, report progress with no code
change, fail and hang the way the engine's own runs do, and are refused before anything starts
when the code they name cannot be found."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from textual.widgets import Static

from ddptui.app import DdptuiApp
from ddptui.screens.run import RunScreen
from ddptui.widgets.rank_table import RankTable
from engine.core.common.statuses import RankActivity, RunStatus
from engine.core.config.schema import ConfigError, DataConfig, ModelConfig, RunConfig, ScriptConfig
from engine.core.config.user_code import check_user_code, module_location
from engine.core.runs.events import (
    MetricsReported,
    RankStalled,
    StacksTaken,
    StepProgress,
    read_events,
)
from engine.core.runs.observer import observe_run
from engine.core.runs.rundir import RunDir, list_runs
from tests.fixtures.live_runs import ddptui, run_processes
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for
from tests.ui.standins import settle, text_of

BYO = REPO_ROOT / "tests" / "fixtures" / "byo"
TUTORIAL = "tests/fixtures/tutorial_ddp.py"


# ---- finding the user's code, without running it ------------------------------------------


def test_a_module_is_found_without_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "loud"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('ran the user package')\n")
    (package / "nets.py").write_text("def build(): ...\n")
    monkeypatch.chdir(tmp_path)
    assert module_location("loud.nets") == str(package / "nets.py")  # found, nothing executed
    assert module_location("loud.absent") is None
    config = RunConfig(model=ModelConfig(factory="nowhere.nets:build"))
    with pytest.raises(ConfigError, match=r"model.factory = 'nowhere.nets:build': no module"):
        check_user_code(config)
    with pytest.raises(ConfigError, match=r"script.path = 'absent.py': no such file"):
        check_user_code(RunConfig(script=ScriptConfig(path="absent.py")))
    with pytest.raises(ConfigError, match=r"expected package.module:callable"):
        DataConfig(factory="not a factory")


def test_the_rank_names_the_key_when_a_factory_goes_wrong(byo_path: None) -> None:
    from engine.train.user_factories import build_user_model, user_datasets

    with pytest.raises(ConfigError) as missing:
        build_user_model(ModelConfig(factory="mymodels.nets:nope"), 10)
    assert (
        str(missing.value)
        == "model.factory = 'mymodels.nets:nope': module mymodels.nets has no 'nope'"
    )
    with pytest.raises(ConfigError, match=r"returned a str; expected a torch.nn.Module"):
        build_user_model(ModelConfig(factory="mymodels.nets:not_a_model"), 10)
    with pytest.raises(ConfigError, match=r"samples are int; expected \(input tensor, label\)"):
        user_datasets(DataConfig(factory="mymodels.data:not_pairs"))
    model = build_user_model(
        ModelConfig(factory="mymodels.nets:tiny_mlp", factory_args={"hidden": 8}), 3
    )
    assert model[-1].out_features == 3 and model[1].out_features == 8  # num_classes and the args


# ---- your model and data, in the engine's loop ---------------------------------------------


@pytest.mark.slow
def test_your_model_and_data_train_under_single_and_ddp_into_a_speedup_table(
    runs_dir: Path, byo_path: None, tmp_path: Path
) -> None:
    result = ddptui(
        "bench", "--suite", str(BYO / "suite.toml"), "--runs-dir", str(runs_dir),
        "--db", str(tmp_path / "results.sqlite3"), "--format", "json", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    table = json.loads(result.stdout)
    rows = {r["label"]: r for r in table["rows"]}
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert (rows["single"]["strategy"], rows["ddp x2"]["strategy"]) == ("single", "ddp")
    assert all(r["test_accuracy"] > 0.9 for r in rows.values())
    summaries = [r.read_summary() for r in list_runs(runs_dir)]
    assert {s.model for s in summaries if s} == {"mymodels.nets:tiny_mlp"}
    assert {s.dataset for s in summaries if s} == {"mymodels.data:blobs"}


@pytest.mark.slow
def test_a_factory_that_does_not_exist_is_refused_before_anything_starts(runs_dir: Path) -> None:
    result = ddptui(
        "run",
        str(BYO / "blobs.toml"),
        "--set",
        "model.factory=mymodels.nets:tiny_mlp",
        "--runs-dir",
        str(runs_dir),
    )  # fmt: skip  (no PYTHONPATH: the package cannot be found)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "model.factory = 'mymodels.nets:tiny_mlp': no module 'mymodels.nets'" in line
    assert list(runs_dir.iterdir()) == []


@pytest.mark.slow
def test_a_factory_the_rank_cannot_use_fails_the_run_in_one_sentence(
    runs_dir: Path, byo_path: None
) -> None:
    result = ddptui(
        "run", str(BYO / "blobs.toml"), "--set", "model.factory=mymodels.nets:not_a_model",
        "--set", "model.factory_args={}", "--runs-dir", str(runs_dir), timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    (run_dir,) = list_runs(runs_dir)
    summary = run_dir.read_summary()
    assert summary is not None and summary.failure is not None
    # every rank met it: the preset's fault, not one rank's, and no rank is blamed (#21 item 8)
    assert (summary.failure.rank, summary.failure.every_rank) == (None, True)
    assert summary.failure.error == (
        "every rank failed with the same error: ConfigError: model.factory = "
        "'mymodels.nets:not_a_model' returned a str; expected a torch.nn.Module"
    )
    assert summary.reason == summary.failure.error


# ---- your own script, launched like torchrun ------------------------------------------------


def steps_of(run_dir: RunDir, rank: int) -> list[StepProgress]:
    return [e for e in read_events(run_dir.rank_events_path(rank)) if isinstance(e, StepProgress)]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_plain_ddp_script_runs_with_per_rank_progress_and_no_code_change(
    runs_dir: Path,
) -> None:
    result = ddptui(
        "run", TUTORIAL, "--devices", "cpu:2", "--runs-dir", str(runs_dir),
        "--", "--epochs", "2", "--steps", "10", timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "completed: tests/fixtures/tutorial_ddp.py on cpu:2" in result.stdout
    assert "20 optimizer steps on rank 0" in result.stdout
    (run_dir,) = list_runs(runs_dir)
    for rank in (0, 1):
        steps = steps_of(run_dir, rank)
        assert steps and steps[-1].global_step == 20, rank  # the optimizer hook counted them
        assert steps[-1].lr == pytest.approx(0.1)
        assert steps[-1].loss is None  # the script reported no loss: none is made up
    bars = steps_of(run_dir, 0)[-1]
    assert (bars.epoch, bars.step, bars.steps) == (1, 10, 10)  # rank 0's printed bar
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.COMPLETED
    assert (summary.strategy, summary.model, summary.global_steps) == ("script", TUTORIAL, 20)
    assert run_processes(run_dir) == []
    # the Run screen: each rank's steps, and a rate in steps a second (no images/s was reported)
    app = DdptuiApp(runs_dir, gpu_poll_seconds=3600, list_poll_seconds=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(run_dir)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        await settle(pilot, lambda: screen.view is not None)
        table = screen.query_one(RankTable)
        lines = text_of(table).splitlines()
        assert "step/s" in lines[0] and "img/s" not in lines[0]
        assert lines[1].split()[:2] == ["0", "cpu"] and "10/10" in lines[1].split()
        assert "20" in lines[2].split()  # rank 1 printed no bar: its optimizer steps so far
        head = text_of(screen.query_one("#run-title", Static))
        assert "steps only (ddptui.report adds loss, accuracy, img/s)" in head


@pytest.mark.slow
def test_a_raise_on_rank_1_ends_the_script_run_with_its_traceback(runs_dir: Path) -> None:
    began = time.monotonic()
    result = ddptui(
        "run", TUTORIAL, "--devices", "cpu:2", "--runs-dir", str(runs_dir),
        "--", "--epochs", "50", "--steps", "20", "--fail-rank", "1", "--at-step", "5",
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 1
    (run_dir,) = list_runs(runs_dir)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.FAILED
    assert summary.failure is not None and summary.failure.rank == 1
    assert summary.failure.error == "RuntimeError: the script failed on purpose at step 5"
    assert "tutorial_ddp.py" in summary.failure.traceback
    failed_at = next(
        e.time for e in read_events(run_dir.rank_events_path(1)) if e.type == "rank_failed"
    )
    assert summary.finished - failed_at < 15, "the run took too long to end after the raise"
    assert time.monotonic() - began < 120
    assert run_processes(run_dir) == []


@pytest.mark.slow
def test_a_hanging_script_is_flagged_stalled_and_its_stacks_name_the_line(
    runs_dir: Path, run_reaper: None
) -> None:
    started = ddptui(
        "run", TUTORIAL, "--devices", "cpu:2", "--runs-dir", str(runs_dir), "--detach",
        "--", "--epochs", "50", "--steps", "20", "--hang-rank", "1", "--at-step", "8",
        "--step-seconds", "0.05",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_dir = RunDir(runs_dir / started.stdout.strip().splitlines()[-1])

    def taken() -> list[StacksTaken]:
        return [e for e in read_events(run_dir.launcher_events_path) if isinstance(e, StacksTaken)]

    assert wait_for(taken, timeout=120)
    stalled = [e for e in read_events(run_dir.launcher_events_path) if isinstance(e, RankStalled)]
    assert stalled, "the stall was not flagged"
    diagnosis = observe_run(run_dir).diagnosis
    assert diagnosis is not None and diagnosis.culprit is not None
    culprit = diagnosis.culprit
    assert culprit.rank == 1 and culprit.frame is not None
    assert (Path(culprit.frame.filename).name, culprit.frame.function) == (
        "tutorial_ddp.py", "hang_here",
    )  # fmt: skip
    (rank0,) = [r for r in diagnosis.ranks if r.rank == 0]
    assert rank0.activity == RankActivity.WAITING
    killed = ddptui("kill", run_dir.run_id, "--runs-dir", str(runs_dir), timeout=90)
    assert killed.returncode == 0, killed.stderr
    assert run_processes(run_dir) == []


@pytest.mark.slow
def test_a_module_gets_the_torchrun_contract_and_its_reported_figures_show(
    runs_dir: Path, byo_path: None
) -> None:
    result = ddptui(
        "run", "-m", "reporting_train", "--devices", "cpu:2", "--runs-dir", str(runs_dir),
        "--", "--steps", "12", timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = list_runs(runs_dir)
    contracts = {}
    for rank in (0, 1):
        log = run_dir.rank_log_path(rank).read_text()
        line = next(x for x in log.splitlines() if x.startswith("contract "))
        contracts[rank] = json.loads(line.removeprefix("contract "))
    assert [c["RANK"] for c in contracts.values()] == ["0", "1"]
    assert {c["WORLD_SIZE"] for c in contracts.values()} == {"2"}
    assert {c["LOCAL_WORLD_SIZE"] for c in contracts.values()} == {"2"}
    assert {c["MASTER_ADDR"] for c in contracts.values()} == {"127.0.0.1"}
    assert all(c["MASTER_PORT"] and c["MASTER_PORT"].isdigit() for c in contracts.values())
    assert {c["CUDA_VISIBLE_DEVICES"] for c in contracts.values()} == {""}  # a CPU run
    reported = [
        e for e in read_events(run_dir.rank_events_path(0)) if isinstance(e, MetricsReported)
    ]
    assert len(reported) == 12 and reported[-1].metrics["images_per_s"] == 1011.0
    last = steps_of(run_dir, 0)[-1]
    assert last.loss is not None and last.images_per_s == 1011.0
    state = observe_run(run_dir)
    assert state.metrics_reported and state.accuracy == pytest.approx(0.5 + 11 / 24)
    assert state.script == "-m reporting_train"


def test_report_is_a_no_op_outside_a_run() -> None:
    from ddptui.report import report
    from engine.core.runs.script_reporting import current

    assert current() is None
    report(loss=1.0)  # nothing to report to, and nothing raised


def test_a_preset_names_a_script_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.core.config.presets import list_presets, load_preset

    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "train.py").write_text("print('training')\n")
    (presets / "mine.toml").write_text(
        'description = "my script"\n[script]\npath = "train.py"\nargs = ["--epochs", "2"]\n'
    )
    monkeypatch.setenv("DDPTUI_PRESETS", str(presets))
    monkeypatch.chdir(REPO_ROOT)  # somewhere else than the preset
    assert "mine" in [p.name for p in list_presets()]
    config = load_preset("mine")
    assert config.script.path == str(presets / "train.py")
    assert config.script.args == ("--epochs", "2")
    check_user_code(config)  # found, wherever ddptui runs from
