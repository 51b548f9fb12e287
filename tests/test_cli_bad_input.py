"""Bad input to ddptui run: one clear sentence, exit code 2, no run directory, no process."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from ddptui.cli import main


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
    from engine.core import gpus

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
    assert "ok  cpu-demo" in output
    assert "no  seed-ddp" in output
    assert "cannot run here: devices.spec 'all' asks for GPUs" in output


def test_help_teaches_by_example() -> None:
    code, output = run_cli("run", "--help")
    assert code == 0
    for text in ("ddptui run cpu-demo", "--devices", "--max-steps", "--fault", "Exit code 0"):
        assert text in output
