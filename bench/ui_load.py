"""How much CPU the UI costs while it watches an 8-rank run on 8 GPUs reporting at its full rate.

    python bench/ui_load.py                 # 8 ranks on 8 stand-in GPUs, 4 reports/s each, 20 s
    python bench/ui_load.py --screen gpus   # the GPUs screen instead of the run screen
    python bench/ui_load.py --step-view     # the run screen's step view (t): bars and curves
    python bench/ui_load.py --gpus 0        # CPU ranks, this machine's own NVML (or none)
    python bench/ui_load.py --ranks 16 --seconds 30 --report-interval 0.1

A writer process (not measured) appends what 8 real ranks append: a StepProgress and a
StepBreakdownReported event every ``training.report_interval`` seconds per rank (0.25 s, the
default) and a log line per report,
with the launcher alive in run.json. With ``--gpus N`` (8 by default) the run is on GPUs 0..N-1 of
the NVML stand-in the UI tests use (tests/fixtures/standin_nvml.py: eight H100s, some held by foreign,
orphaned and hidden processes), sampled every second as in use, so the run screen draws 8 GPU
lines. The app runs headless in this process at 80x24 with the run screen (or the GPUs screen, whose
process scan reads this machine's real processes and their open files every 2 s) open, polling at
its real intervals. This process's CPU time (all its threads: the event loop, the readers, NVML)
over the measured wall time is the figure; the target is under 10 % of one core. The baseline, in
the same run, is a bare Textual app (a header and a footer) idling as long. Responsiveness is the
event loop's lag: how late a 10 Hz timer fires, as the 95th percentile and the worst case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.core.config.presets import load_preset  # noqa: E402
from engine.core.config.toml_io import apply_overrides, to_toml  # noqa: E402
from engine.core.procs.process_identity import ProcessRef  # noqa: E402
from engine.core.runs.events import (  # noqa: E402
    EpochStarted,
    EventWriter,
    RankStarted,
    RunStarted,
    StepBreakdownReported,
    StepProgress,
)
from engine.core.runs.rundir import RunDir, RunInfo  # noqa: E402

TARGET_PERCENT = 10.0


@contextlib.contextmanager
def stand_in_gpus(count: int) -> Iterator[None]:
    """The UI tests' NVML stand-in (eight H100s) for the UI in this process; none with 0."""
    if not count:
        yield
        return
    from tests.fixtures.standin_nvml import EIGHT_GPUS, standin_nvml

    with standin_nvml(machine=EIGHT_GPUS[:count]):
        yield


def devices_of(ranks: int, gpus: int) -> str:
    if gpus:
        return "gpu:" + ",".join(str(i % gpus) for i in range(min(ranks, gpus)))
    return f"cpu:{ranks}"


def make_run(runs_dir: Path, ranks: int, gpus: int = 0) -> RunDir:
    overrides: dict[str, object] = {
        "devices.spec": devices_of(ranks, gpus) if gpus else f"cpu:{ranks}"
    }
    config = apply_overrides(load_preset("cpu-demo"), overrides)
    run = RunDir(runs_dir / "20261202-120000-ui-load-0000")
    run.create()
    run.config_path.write_text(to_toml(config), encoding="utf-8")
    return run


def name_launcher(run: RunDir, ranks: int, pid: int, start_time: float, gpus: int = 0) -> None:
    """run.json naming the writer as launcher and ranks, so the UI sees a live run."""
    ref = ProcessRef(pid, start_time)
    run.write_run_info(
        RunInfo(
            run_id=run.run_id,
            preset="cpu-demo",
            host="bench",
            created=time.time(),
            state="running",
            world_size=ranks,
            devices=devices_of(ranks, gpus),
            launcher=ref,
            ranks=tuple(ref for _ in range(ranks)),
        )
    )


def write_events(
    run_path: str, ranks: int, interval: float, stop_after: float, gpus: int = 0
) -> None:
    """The stand-in ranks: every ``interval`` each rank appends one step event and one log line."""
    run = RunDir(Path(run_path))
    pid = os.getpid()
    writers = [EventWriter(run.rank_events_path(r)) for r in range(ranks)]
    logs = [open(run.rank_log_path(r), "a", encoding="utf-8") for r in range(ranks)]  # noqa: SIM115
    with EventWriter(run.launcher_events_path) as launcher:
        launcher.write(
            RunStarted(
                run_id=run.run_id, world_size=ranks, launcher_pid=pid, devices=f"cpu:{ranks}"
            )
        )
    steps = 100_000
    for r, w in enumerate(writers):
        device, index = (f"cuda:{r % gpus}", r % gpus) if gpus else ("cpu", None)
        w.write(
            RankStarted(
                rank=r, world_size=ranks, pid=pid, host="bench", device=device, gpu_index=index
            )
        )
        w.write(EpochStarted(rank=r, epoch=0, steps=steps))
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < stop_after:
        step += 1
        for r, w in enumerate(writers):
            w.write(
                StepProgress(
                    rank=r,
                    epoch=0,
                    step=step,
                    steps=steps,
                    global_step=step,
                    loss=2.3 / (1 + step / 100),
                    images_per_s=512.0,
                    step_seconds=interval,
                    lr=0.05,
                )
            )
            w.write(  # what a rank's step timer writes as often
                StepBreakdownReported(
                    rank=r, steps=1, timed=1, data=0.1 * interval, forward=0.3 * interval,
                    backward=0.4 * interval, sync=0.15 * interval, optimizer=0.04 * interval,
                    other=0.01 * interval,
                )
            )  # fmt: skip
            logs[r].write(
                f"[rank {r}] epoch 1 step {step}/{steps} loss {2.3 / (1 + step / 100):.4f}\n"
            )
            logs[r].flush()
        next_at = start + step * interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    for w in writers:
        w.close()
    for f in logs:
        f.close()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def lagging(seconds: float) -> tuple[float, float, list[float]]:
    """(CPU seconds, wall seconds, lags) while a 10 Hz timer runs for ``seconds``."""
    lags: list[float] = []
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    tick = 0.1
    expected = time.monotonic() + tick
    while time.monotonic() - wall0 < seconds:
        await asyncio.sleep(max(0.0, expected - time.monotonic()))
        lags.append(max(0.0, time.monotonic() - expected))
        expected += tick
    return cpu_seconds() - cpu0, time.monotonic() - wall0, lags


async def measure(
    runs_dir: Path, run: RunDir, warmup: float, seconds: float, screen_name: str, step_view: bool
) -> dict[str, float]:
    from ddptui.app import DdptuiApp
    from ddptui.screens.gpus import GpusScreen
    from ddptui.screens.run import RunScreen

    app = DdptuiApp(runs_dir)
    result: dict[str, float] = {}
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.5)
        if screen_name == "gpus":
            app.action_show("gpus")
        else:
            app.open_run(run)
            if step_view:  # each rank's step split and the curves per step, in place of the log
                await pilot.pause(0.5)
                await pilot.press("t")
        await pilot.pause(warmup)
        screen = app.screen
        if isinstance(screen, RunScreen):
            events_before = screen.view.run.events_read if screen.view else 0
            coalesced_before = screen.coalesced
        cpu, wall, lags = await lagging(seconds)
        result = {
            "cpu_percent_of_one_core": 100.0 * cpu / wall,
            "measured_seconds": wall,
            "loop_lag_p95_ms": 1000 * statistics.quantiles(lags, n=20)[-1],
            "loop_lag_max_ms": 1000 * max(lags),
            "gpus_shown": float(len(app.gpu_inventory.gpus) if app.gpu_inventory else 0),
        }
        if isinstance(screen, RunScreen):
            view = screen.view
            result["events_read"] = float((view.run.events_read if view else 0) - events_before)
            result["stale_updates_skipped"] = float(screen.coalesced - coalesced_before)
            result["ranks_shown"] = float(len(view.run.ranks) if view else 0)
            result["rank_table_folded"] = float(screen.query_one("#ranks").folded)  # type: ignore[attr-defined]
        elif isinstance(screen, GpusScreen):
            result["processes_shown"] = float(len(screen.view.rows) if screen.view else 0)
    return result


async def measure_bare(seconds: float) -> float:
    """A Textual app with a header and a footer, idling: the floor of any Textual UI."""
    from textual.app import App, ComposeResult
    from textual.widgets import Footer, Header

    class Bare(App[None]):
        def compose(self) -> ComposeResult:
            yield Header()
            yield Footer()

    async with Bare().run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.5)
        cpu, wall, _ = await lagging(seconds)
    return 100.0 * cpu / wall


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument(
        "--report-interval", type=float, default=0.25, help="seconds between a rank's reports"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--gpus", type=int, default=8, help="stand-in GPUs the run uses (0: CPU ranks, real NVML)"
    )
    parser.add_argument("--screen", choices=("run", "gpus"), default="run")
    parser.add_argument(
        "--step-view", action="store_true", help="the run screen's step view (t): bars and curves"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the bare-app baseline")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--check", action="store_true", help=f"exit 1 above {TARGET_PERCENT:g} %% of a core"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, stand_in_gpus(args.gpus):
        runs_dir = Path(tmp) / "runs"
        runs_dir.mkdir()
        run = make_run(runs_dir, args.ranks, args.gpus)
        writer = mp.get_context("spawn").Process(
            target=write_events,
            args=(
                str(run.path),
                args.ranks,
                args.report_interval,
                args.warmup + args.seconds + 5,
                args.gpus,
            ),
            daemon=True,
        )
        writer.start()
        assert writer.pid is not None
        name_launcher(
            run, args.ranks, writer.pid, psutil.Process(writer.pid).create_time(), args.gpus
        )
        try:
            figures = asyncio.run(
                measure(runs_dir, run, args.warmup, args.seconds, args.screen, args.step_view)
            )
        finally:
            writer.terminate()
            writer.join(5)
        if not args.no_baseline:
            figures["bare_textual_cpu_percent"] = asyncio.run(measure_bare(args.seconds))
            figures["ratio_to_bare"] = figures["cpu_percent_of_one_core"] / max(
                0.01, figures["bare_textual_cpu_percent"]
            )
    figures["ranks"] = float(args.ranks)
    figures["report_interval"] = args.report_interval
    figures["load_average"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        what = (
            f"the {args.screen} screen of {args.ranks} ranks on {args.gpus or 'no'} stand-in GPUs"
        )
        line = (
            f"UI CPU watching {what} reporting every {args.report_interval:g} s: "
            f"{figures['cpu_percent_of_one_core']:.1f} % of one core over "
            f"{figures['measured_seconds']:.0f} s (target < {TARGET_PERCENT:g} %)"
        )
        if "bare_textual_cpu_percent" in figures:
            line += (
                f"; a bare Textual app idles at {figures['bare_textual_cpu_percent']:.1f} % "
                f"(ratio {figures['ratio_to_bare']:.1f})"
            )
        print(line)
        print(
            f"event-loop lag p95 {figures['loop_lag_p95_ms']:.1f} ms, worst "
            f"{figures['loop_lag_max_ms']:.1f} ms; "
            + ", ".join(
                f"{k.replace('_', ' ')} {v:.0f}"
                for k, v in figures.items()
                if k in ("events_read", "stale_updates_skipped", "ranks_shown", "processes_shown")
            )
            + f"; load average {figures['load_average']:.2f}"
        )
    if args.check and figures["cpu_percent_of_one_core"] >= TARGET_PERCENT:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
