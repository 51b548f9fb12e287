"""The resource guard: a plan whose ranks cannot fit in this machine's cores, memory or GPUs is
refused before anything starts, with one sentence naming what and the figures.

The machine is injected (cores, available memory, a GPU inventory, cgroup files under tmp_path),
so these figures hold on any machine; one slow test measures real ranks against the estimate."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from ddptui.cli import main
from ddptui.run_options import collect_overrides
from engine.core.backends.local.start import prepare_run, start_run
from engine.core.config.presets import load_preset
from engine.core.config.schema import MODELS, ConfigError, ModelConfig
from engine.core.config.toml_io import apply_overrides, load_config, to_toml
from engine.core.host.gpus import GpuInventory, GpuProcess, GpuSample
from engine.core.plan import resource_guard
from engine.core.plan.memory_estimate import GIB, MIB, estimate_memory, parameter_count
from engine.core.plan.resource_guard import ResourceError, check_resources
from engine.core.plan.run_plan import RunPlan, plan_run

PLENTY = 10**15  # bytes: more memory than any estimate here


def cpu_plan(**overrides: Any) -> RunPlan:
    return plan_run(apply_overrides(load_preset("cpu-demo"), overrides), 0)


def gpu_plan(gpus: int = 1, **overrides: Any) -> RunPlan:
    settings = {"devices.spec": "gpu:" + ",".join(str(i) for i in range(gpus)), **overrides}
    return plan_run(apply_overrides(load_preset("cpu-demo"), settings), gpus)


def gpu(index: int, *, used_gib: float, total_gib: float = 40.0, pids: tuple[int, ...] = ()):  # type: ignore[no-untyped-def]
    return GpuSample(
        index=index,
        name="NVIDIA A100-SXM4-40GB",
        memory_used_bytes=int(used_gib * GIB),
        memory_total_bytes=int(total_gib * GIB),
        processes=tuple(GpuProcess(pid=pid, used_memory_bytes=GIB) for pid in pids),
    )


# ---- CPU ranks per core ------------------------------------------------------------------------


def test_cpu_ranks_beyond_four_per_core_are_refused() -> None:
    with pytest.raises(ResourceError) as refused:
        check_resources(cpu_plan(**{"devices.spec": "cpu:9"}), cores=2, available_bytes=PLENTY)
    assert str(refused.value) == (
        "devices.spec cpu:9 asks for 9 CPU ranks, but this machine has 2 cores (at most 8 ranks, "
        "4 per core); use fewer ranks or set devices.oversubscribe = true"
    )
    assert isinstance(refused.value, ConfigError)  # every ConfigError path exits 2


def test_four_ranks_per_core_is_allowed_and_oversubscribe_allows_more() -> None:
    at_limit = check_resources(
        cpu_plan(**{"devices.spec": "cpu:8"}), cores=2, available_bytes=PLENTY
    )
    assert at_limit.cores == 2 and at_limit.warnings == ()
    over = cpu_plan(**{"devices.spec": "cpu:9", "devices.oversubscribe": "true"})
    assert check_resources(over, cores=2, available_bytes=PLENTY).estimate.ranks == 9
    with pytest.raises(ResourceError, match="this machine has 1 core \\(at most 4 ranks"):
        check_resources(cpu_plan(**{"devices.spec": "cpu:5"}), cores=1, available_bytes=PLENTY)


def test_oversubscribe_is_a_config_key_a_flag_and_round_trips(tmp_path: Path) -> None:
    config = apply_overrides(load_preset("cpu-demo"), {"devices.oversubscribe": "true"})
    assert config.devices.oversubscribe is True
    assert load_preset("cpu-demo").devices.oversubscribe is False
    path = tmp_path / "config.toml"
    path.write_text(to_toml(config))
    assert load_config(path, name=config.name) == config
    with pytest.raises(ConfigError, match=r"devices\.oversubscribe is 'yes'.*true or false"):
        apply_overrides(load_preset("cpu-demo"), {"devices.oversubscribe": "yes"})
    assert collect_overrides((), oversubscribe=True) == {"devices.oversubscribe": True}
    assert collect_overrides((), oversubscribe=None) == {}


# ---- host memory --------------------------------------------------------------------------------


def test_a_plan_that_does_not_fit_in_memory_is_refused_with_the_figures() -> None:
    plan = cpu_plan(**{"devices.spec": "cpu:4"})
    needed = estimate_memory(plan).host_bytes
    assert check_resources(plan, cores=8, available_bytes=needed).host_bytes == needed
    with pytest.raises(ResourceError) as refused:
        check_resources(plan, cores=8, available_bytes=2 * GIB)
    message = str(refused.value)
    assert message.startswith("the run (cpu:4, small_cnn, batch 128 per rank, 12000 + 2000 images)")
    assert f"needs an estimated {needed / GIB:.1f} GiB of host memory (4 ranks x " in message
    assert "but 2.0 GiB is available here; use fewer ranks" in message
    assert "\n" not in message


def test_oversubscribe_does_not_lift_the_memory_rule() -> None:
    # A batch each of the 999 ranks' 12 images holds: the rule at stake is the guard's.
    plan = cpu_plan(
        **{"devices.spec": "cpu:999", "devices.oversubscribe": "true", "training.batch_size": 8}
    )
    with pytest.raises(ResourceError, match=r"999 ranks x .* but 23\.0 GiB is available"):
        check_resources(plan, cores=2, available_bytes=23 * GIB)


def test_dataloader_workers_count_and_are_named() -> None:
    tensor = cpu_plan()
    workers = cpu_plan(**{"data.pipeline": "torchvision", "data.num_workers": 4})
    assert estimate_memory(tensor).workers_host_bytes == 0
    # 4 for training (persistent) + 4 for evaluation, each at least an interpreter with torch.
    assert estimate_memory(workers).workers_host_bytes > 8 * 400 * MIB
    with pytest.raises(ResourceError, match=r"DataLoader workers.*fewer data\.num_workers"):
        check_resources(workers, cores=8, available_bytes=4 * GIB)


def test_the_estimate_grows_with_what_a_rank_holds() -> None:
    base = estimate_memory(cpu_plan())
    assert estimate_memory(cpu_plan(**{"devices.spec": "cpu:4"})).host_bytes > base.host_bytes
    for bigger in (
        {"training.batch_size": 256},
        {"data.train_size": 50_000},
        {"model.name": "resnet50"},
        {"model.name": "resnet50", "model.imagenet_head": "true"},
    ):
        assert estimate_memory(cpu_plan(**bigger)).rank_host_bytes > base.rank_host_bytes, bigger


def test_parameter_table_matches_the_real_models() -> None:
    from torch import nn

    from engine.train.models import build_model

    for name in MODELS:
        model = build_model(ModelConfig(name=name))
        assert parameter_count(ModelConfig(name=name)) == sum(
            p.numel() for p in model.parameters()
        ), name
        # The 1,000-class head: 990 more outputs of the last linear layer, weights and biases.
        head = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
        extra = parameter_count(ModelConfig(name=name, imagenet_head=True)) - parameter_count(
            ModelConfig(name=name)
        )
        assert extra == 990 * (head.in_features + 1), name


# ---- GPUs -----------------------------------------------------------------------------------------


def test_a_gpu_without_room_is_refused() -> None:
    plan = gpu_plan(**{"model.name": "resnet50", "training.batch_size": 256})
    inventory = GpuInventory(gpus=(gpu(0, used_gib=39.5),))
    with pytest.raises(ResourceError) as refused:
        check_resources(plan, inventory=inventory, available_bytes=PLENTY, cores=8)
    needed = estimate_memory(plan).device_bytes_per_gpu
    assert str(refused.value) == (
        f"GPU 0 has 512 MiB free of 40.0 GiB, but each GPU of this run needs an estimated "
        f"{needed / GIB:.1f} GiB (resnet50 at batch 256); free that GPU, pick another with "
        "--devices, or use a smaller batch"
    )


def test_a_gpu_held_by_another_process_with_room_is_a_warning() -> None:
    plan = gpu_plan(2)
    inventory = GpuInventory(gpus=(gpu(0, used_gib=13, pids=(31010,)), gpu(1, used_gib=0)))
    check = check_resources(plan, inventory=inventory, available_bytes=PLENTY, cores=8)
    assert len(check.warnings) == 1
    assert check.warnings[0].startswith("GPU 0 is also used by 1 other process (pid 31010)")
    assert check.device_bytes_per_gpu > 0
    free = GpuInventory(gpus=(gpu(0, used_gib=0), gpu(1, used_gib=0)))
    assert check_resources(plan, inventory=free, available_bytes=PLENTY, cores=8).warnings == ()


def test_without_nvml_the_gpu_rules_are_skipped_quietly() -> None:
    plan = gpu_plan(**{"model.name": "resnet50"})
    no_nvml = GpuInventory(error="NVML: Driver Not Loaded")
    check = check_resources(plan, inventory=no_nvml, available_bytes=PLENTY, cores=8)
    assert check.warnings == ()


def test_dataparallel_splits_the_batch_across_its_gpus() -> None:
    one = gpu_plan(1, **{"strategy.name": "single", "model.name": "resnet50"})
    split = gpu_plan(4, **{"strategy.name": "dataparallel", "model.name": "resnet50"})
    assert estimate_memory(split).device_bytes_per_gpu < estimate_memory(one).device_bytes_per_gpu
    assert estimate_memory(split).ranks == 1


def test_cuda_ranks_count_the_cuda_context_on_the_host() -> None:
    cpu_rank = estimate_memory(cpu_plan(**{"devices.spec": "cpu:1", "strategy.name": "single"}))
    cuda_rank = estimate_memory(gpu_plan(1, **{"strategy.name": "single"}))
    assert cuda_rank.rank_host_bytes >= cpu_rank.rank_host_bytes + GIB


# ---- where it is wired ----------------------------------------------------------------------------


def test_prepare_run_refuses_before_creating_anything(
    runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resource_guard, "usable_cores", lambda: 2)
    config = apply_overrides(load_preset("cpu-demo"), {"devices.spec": "cpu:9"})
    with pytest.raises(ResourceError, match="asks for 9 CPU ranks"):
        prepare_run(config, runs_dir, gpu_count=0)
    with pytest.raises(ResourceError, match="asks for 9 CPU ranks"):
        start_run(config, runs_dir, gpu_count=0)
    assert list(runs_dir.iterdir()) == []


def test_ddptui_run_cpu_999_exits_2_with_one_line(
    runs_dir: Path, no_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resource_guard, "usable_cores", lambda: 2)
    monkeypatch.setattr(resource_guard, "available_memory_bytes", lambda: 23 * GIB)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    # --batch-size 8: a batch each of the 999 ranks' 12 images holds (else that is refused first)
    result = CliRunner().invoke(
        main,
        ["run", "cpu-demo", "--devices", "cpu:999", "--batch-size", "8", "--runs-dir",
         str(runs_dir)],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr == (
        "ddptui: devices.spec cpu:999 asks for 999 CPU ranks, but this machine has 2 cores (at "
        "most 8 ranks, 4 per core); use fewer ranks or set devices.oversubscribe = true\n"
    )
    assert list(runs_dir.iterdir()) == []
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    oversubscribed = CliRunner().invoke(
        main,
        [
            "run",
            "cpu-demo",
            "--devices",
            "cpu:999",
            "--oversubscribe",
            "--batch-size",
            "8",
            "--runs-dir",
            str(runs_dir),
        ],
    )
    assert oversubscribed.exit_code == 2
    assert re.fullmatch(
        r"ddptui: the run \(cpu:999, .* GiB of host memory .*\n", oversubscribed.stderr
    )
    assert list(runs_dir.iterdir()) == []


def test_ddptui_run_prints_the_guards_warnings(
    runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.core.backends.registry import LOCAL

    plan = gpu_plan()
    inventory = GpuInventory(gpus=(gpu(0, used_gib=13, pids=(31010,)),))
    check = check_resources(plan, inventory=inventory, available_bytes=PLENTY, cores=8)

    class Started:  # what start_run returns, without a launcher behind it
        run_id = "the-run"
        warnings = check.warnings

    # this machine's backend starts nothing here
    monkeypatch.setattr(LOCAL, "start", lambda config, runs_dir: Started())
    result = CliRunner().invoke(main, ["run", "cpu-demo", "--detach", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout == "the-run\n"
    assert result.stderr.startswith("ddptui: warning: GPU 0 is also used by 1 other process")


# ---- measured against the estimate ----------------------------------------------------------------


def peak_rss(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(found[1]) * 1024 if found else None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_the_estimate_is_not_below_what_real_ranks_hold(runs_dir: Path) -> None:
    """cpu-demo on 2 ranks for a few steps (evaluation and checkpoint included): each rank's peak
    RSS, sampled every 20 ms from the kernel's high-water mark, is at most the estimate."""
    config = apply_overrides(
        load_preset("cpu-demo"),
        {"training.epochs": 1, "training.max_steps": 4, "training.warmup_steps": 0},
    )
    started = start_run(config, runs_dir, gpu_count=0)
    launcher = psutil.Process(started.process.pid)
    peaks: dict[int, int] = {}
    deadline = time.monotonic() + 120
    try:
        while started.poll() is None and time.monotonic() < deadline:
            try:
                ranks = [p for p in launcher.children() if "spawn_main" in " ".join(p.cmdline())]
            except psutil.Error:
                ranks = []
            for rank in ranks:
                value = peak_rss(rank.pid)
                if value is not None:
                    peaks[rank.pid] = max(peaks.get(rank.pid, 0), value)
            time.sleep(0.02)
    finally:
        if started.poll() is None:
            started.process.terminate()
        started.wait(timeout=30)
    summary = started.run_dir.read_summary()
    assert summary is not None and summary.status == "completed", summary
    assert len(peaks) == 2
    assert started.resources is not None and started.warnings == ()
    estimate = estimate_memory(started.plan)
    measured = max(peaks.values())
    assert measured <= estimate.rank_host_bytes, (
        f"a rank peaked at {measured / MIB:.0f} MiB, above the estimate of "
        f"{estimate.rank_host_bytes / MIB:.0f} MiB: measure again with bench/rank_memory.py"
    )


def test_ddptui_presets_says_a_preset_does_not_fit_and_why(
    no_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resource_guard, "usable_cores", lambda: 2)
    monkeypatch.setattr(resource_guard, "available_memory_bytes", lambda: 100 * MIB)
    result = CliRunner().invoke(main, ["presets", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["cpu-demo"]["runnable"] is False
    assert "of host memory" in rows["cpu-demo"]["reason"]
    assert "100 MiB is available here" in rows["cpu-demo"]["reason"]
