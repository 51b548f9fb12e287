"""Bad input to ddptui run: one clear sentence, exit code 2, no run directory, no process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from ddptui.cli import main
from tests.fixtures.made_runs import make_run
from tests.fixtures.repo import REPO_ROOT


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["nosuch-preset"], "no preset named 'nosuch-preset'"),
        (["cpu-demo", "--set", "training.epochz=2"], "unknown key training.epochz"),
        (["cpu-demo", "--set", "training.epochs=two"], "training.epochs is 'two'"),
        (
            ["cpu-demo", "--devices", "0,3"],
            "asks for GPUs, but this machine has none visible to NVML",
        ),
        (["cpu-demo", "--precision", "fp16"], "fp16 needs CUDA"),
        (["cpu-demo", "--set", "strategy.name=dataparallel"], "dataparallel needs CUDA"),
        (
            ["cpu-demo", "--data", "cifar10", "--set", "data.root=/nonexistent/cifar"],
            "CIFAR-10 is not at /nonexistent/cifar",
        ),
        (["cpu-demo", "--fault", "explode:0:1"], "fault 'explode:0:1' is not KIND:RANK:STEP"),
        (["cpu-demo", "--set", "oops"], "is not SECTION.KEY=VALUE"),
        (["cpu-demo", "--set", "optimizer.lr=nan"], "optimizer.lr is nan; it must be a finite"),
        (["cpu-demo", "--set", "optimizer.lr=inf"], "optimizer.lr is inf; it must be a finite"),
    ],
)
def test_bad_input_is_refused_before_anything_starts(
    args: list[str], fragment: str, runs_dir: Path, no_gpu: None
) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    code, output = run_cli("run", *args, "--runs-dir", str(runs_dir))
    assert code == 2, output
    assert fragment in output
    assert list(runs_dir.iterdir()) == []
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_gpu_index_that_does_not_exist(runs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.core.host import gpus

    monkeypatch.setattr(gpus, "gpu_count", lambda: 2)
    code, output = run_cli("run", "cpu-demo", "--devices", "0,3", "--runs-dir", str(runs_dir))
    assert code == 2
    assert (
        output.strip() == "ddptui: devices.spec '0,3' names GPU 3, but this machine has GPUs 0 to 1"
    )
    assert list(runs_dir.iterdir()) == []


def test_broken_preset_file_names_file_and_key(tmp_path: Path, runs_dir: Path) -> None:
    preset = tmp_path / "mine.toml"
    preset.write_text('[training]\nbatch_size = "big"\n')
    code, output = run_cli("run", str(preset), "--runs-dir", str(runs_dir))
    assert code == 2
    assert str(preset) in output and "training.batch_size is 'big'" in output
    assert list(runs_dir.iterdir()) == []


def test_presets_lists_every_preset_with_its_reason(no_gpu: None) -> None:
    code, output = run_cli("presets")
    assert code == 0
    assert marked(output, "cpu-demo") == "ok"
    assert marked(output, "seed-ddp") == "no"
    assert "cannot run here: devices.spec 'all' asks for GPUs" in output


def test_presets_finds_a_script_beside_its_preset_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_gpu: None
) -> None:
    """A preset whose ``script.path`` is relative names the script beside the preset file: `ddptui
    presets --json` says it can run, from a directory where no train.py is (as the launch screen
    and `ddptui run` run it), not "no such file"."""
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "train.py").write_text("print('training')\n")
    (presets / "mine.toml").write_text('[script]\npath = "train.py"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("DDPTUI_PRESETS", str(presets))
    monkeypatch.chdir(elsewhere)
    code, output = run_cli("presets", "--json")
    assert code == 0, output
    (mine,) = [row for row in json.loads(output) if row["name"] == "mine"]
    assert mine["source"] == "user" and not mine["broken"]
    assert mine["runnable"], mine["reason"]
    assert mine["reason"].startswith("runs on cpu:"), mine["reason"]


def test_help_teaches_by_example() -> None:
    code, output = run_cli("run", "--help")
    assert code == 0
    for text in ("ddptui run cpu-demo", "--devices", "--max-steps", "--fault", "Exit code 0"):
        assert text in output


# ---- issue 16, finding 4: one sentence and exit 2, never a traceback -------------------------


def marked(output: str, preset: str) -> str:
    """The mark `ddptui presets` gives ``preset``: ok, no or bad."""
    line = next(line for line in output.splitlines() if line.split()[1:2] == [preset])
    return line.split()[0]


def one_sentence(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


@pytest.mark.parametrize(
    ("runs_dir", "fragment"),
    [
        ("/proc/ddptui-runs", "is inside /proc, a kernel file system"),
        ("/sys/kernel/ddptui-runs", "is inside /sys, a kernel file system"),
        ("x" * 300, "one of its names is 300 characters long, and a file system allows at most"),
        ("/etc/hostname", "is not a directory"),
    ],
)
@pytest.mark.parametrize("command", ["run", "runs", "ps", "show", "kill", "clean", "bench"])
def test_a_runs_dir_that_cannot_be_is_one_sentence(
    command: str, runs_dir: str, fragment: str, no_gpu: None
) -> None:
    args = {
        "run": ["run", "cpu-demo"],
        "show": ["show", "some-run"],
        "kill": ["kill", "some-run"],
        "clean": ["clean", "--dry-run"],
        "bench": ["bench", "cpu-demo"],
    }.get(command, [command])
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = CliRunner().invoke(main, [*args, "--runs-dir", runs_dir])
    assert result.exit_code == 2, result.output
    assert fragment in one_sentence(result.output)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
def test_a_runs_dir_the_user_cannot_write_is_one_sentence() -> None:
    import shutil
    import tempfile

    mine = Path(tempfile.mkdtemp(prefix="ddptui-roots-runs-"))  # under /tmp: nobody reaches it
    mine.chmod(0o755)
    try:
        refused_as_nobody(mine)
    finally:
        shutil.rmtree(mine)


def refused_as_nobody(mine: Path) -> None:
    done = subprocess.run(
        [
            "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
            sys.executable, "-m", "ddptui", "run", "cpu-demo", "--runs-dir", str(mine),
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "HOME": "/nonexistent"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    line = one_sentence(done.stderr)
    assert f"--runs-dir {mine} cannot hold new runs" in line and "not writable by nobody" in line
    assert list(mine.iterdir()) == []


@pytest.mark.parametrize(
    ("run_id", "fragment"),
    [
        ("", "a run id cannot be empty"),
        ("../other/RUN", "'../other/RUN' is not a run id"),
        ("..", "'..' is not a run id"),
        ("a/b", "'a/b' is not a run id"),
    ],
)
def test_a_run_id_is_never_a_path(tmp_path: Path, run_id: str, fragment: str) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    other = tmp_path / "other"
    make_run(other, "RUN")  # a run outside --runs-dir
    make_run(runs, "only-run")  # '' used to match it as a prefix
    for command in ("show", "kill"):
        result = CliRunner().invoke(main, [command, run_id, "--runs-dir", str(runs)])
        assert result.exit_code == 2, result.output
        assert fragment in one_sentence(result.output)
    assert not (other / "RUN" / "summary.json").exists()


def test_a_preset_that_is_not_utf8_is_one_sentence_and_the_others_are_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs_dir: Path, no_gpu: None
) -> None:
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "latin.toml").write_bytes(b'description = "caf\xe9"\n')
    (presets / "fine.toml").write_text('description = "mine"\n')
    monkeypatch.setenv("DDPTUI_PRESETS", str(presets))
    code, output = run_cli("run", "latin", "--runs-dir", str(runs_dir))
    assert code == 2
    assert "latin.toml: not UTF-8 text (byte 0xe9 at offset 18)" in one_sentence(output)
    code, output = run_cli("presets")
    assert code == 0, output
    assert marked(output, "cpu-demo") == marked(output, "fine") == "ok"
    assert marked(output, "latin") == "bad"
    assert "broken preset file: " in output and "not UTF-8 text" in output
    result = CliRunner().invoke(main, ["presets", "--json"])
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["latin"]["broken"] and not rows["fine"]["broken"]


def test_an_empty_runs_dir_variable_means_the_default_in_the_cli_and_the_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DDPTUI_RUNS_DIR="" is unset, for every command and for the app alike: ./runs, never the
    working directory itself (the CLI took "" as ".")."""
    from ddptui.app import DdptuiApp

    monkeypatch.setenv("DDPTUI_RUNS_DIR", "")
    monkeypatch.chdir(tmp_path)
    code, output = run_cli("runs")
    assert (code, output) == (0, "No runs in runs (it does not exist).\n")
    assert DdptuiApp().runs_dir == Path("runs")
    monkeypatch.setenv("DDPTUI_RUNS_DIR", str(tmp_path / "mine"))
    assert DdptuiApp().runs_dir == tmp_path / "mine"
    assert run_cli("runs")[1] == f"No runs in {tmp_path / 'mine'} (it does not exist).\n"
