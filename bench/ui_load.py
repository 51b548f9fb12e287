"""How much CPU the UI costs while it watches an 8-rank run reporting at its full rate.

    python bench/ui_load.py                 # 8 ranks, 4 reports a second each, 20 s measured
    python bench/ui_load.py --ranks 16 --seconds 30 --report-interval 0.1

A writer process (not measured) appends what 8 real ranks append: a StepProgress event every
``training.report_interval`` seconds per rank (0.25 s, the default) and a log line per report,
with the launcher alive in run.json. The app runs headless in this process at 80x24 with the run
screen open, polling at its real intervals and sampling NVML as it does in use. This process's CPU
time (all its threads: the event loop, the readers, NVML) over the measured wall time is the
figure; the target is under 10 % of one core. Responsiveness is the event loop's lag: how late a
10 Hz timer fires, as the 95th percentile and the worst case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.core.config import apply_overrides, to_toml  # noqa: E402
from engine.core.events import EpochStarted, EventWriter, RankStarted, RunStarted, StepProgress  # noqa: E402
from engine.core.presets import load_preset  # noqa: E402
from engine.core.process_identity import ProcessRef  # noqa: E402
from engine.core.rundir import RunDir, RunInfo  # noqa: E402

TARGET_PERCENT = 10.0


def make_run(runs_dir: Path, ranks: int) -> RunDir:
    config = apply_overrides(load_preset("cpu-demo"), {"devices.spec": f"cpu:{ranks}"})
    run = RunDir(runs_dir / "20261202-120000-ui-load-0000")
    run.create()
    run.config_path.write_text(to_toml(config), encoding="utf-8")
    return run


def name_launcher(run: RunDir, ranks: int, pid: int, start_time: float) -> None:
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
            devices=f"cpu:{ranks}",
            launcher=ref,
            ranks=tuple(ref for _ in range(ranks)),
        )
    )


def write_events(run_path: str, ranks: int, interval: float, stop_after: float) -> None:
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
        w.write(RankStarted(rank=r, world_size=ranks, pid=pid, host="bench", device="cpu"))
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


async def measure(runs_dir: Path, run: RunDir, warmup: float, seconds: float) -> dict[str, float]:
    from ddptui.app import DdptuiApp
    from ddptui.screens.run import RunScreen

    app = DdptuiApp(runs_dir)
    lags: list[float] = []
    result: dict[str, float] = {}
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.5)
        app.open_run(run)
        await pilot.pause(warmup)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        events_before = screen.view.run.events_read if screen.view else 0
        coalesced_before = screen.coalesced
        cpu0, wall0 = cpu_seconds(), time.monotonic()
        tick = 0.1
        expected = time.monotonic() + tick
        while time.monotonic() - wall0 < seconds:
            await asyncio.sleep(max(0.0, expected - time.monotonic()))
            lags.append(max(0.0, time.monotonic() - expected))
            expected += tick
        cpu1, wall1 = cpu_seconds(), time.monotonic()
        view = screen.view
        result = {
            "cpu_percent_of_one_core": 100.0 * (cpu1 - cpu0) / (wall1 - wall0),
            "measured_seconds": wall1 - wall0,
            "events_read": float((view.run.events_read if view else 0) - events_before),
            "stale_updates_skipped": float(screen.coalesced - coalesced_before),
            "loop_lag_p95_ms": 1000 * statistics.quantiles(lags, n=20)[-1],
            "loop_lag_max_ms": 1000 * max(lags),
            "ranks_shown": float(len(view.run.ranks) if view else 0),
        }
    return result


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
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--check", action="store_true", help=f"exit 1 above {TARGET_PERCENT:g} %% of a core"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp) / "runs"
        runs_dir.mkdir()
        run = make_run(runs_dir, args.ranks)
        writer = mp.get_context("spawn").Process(
            target=write_events,
            args=(str(run.path), args.ranks, args.report_interval, args.warmup + args.seconds + 5),
            daemon=True,
        )
        writer.start()
        assert writer.pid is not None
        name_launcher(run, args.ranks, writer.pid, psutil.Process(writer.pid).create_time())
        try:
            figures = asyncio.run(measure(runs_dir, run, args.warmup, args.seconds))
        finally:
            writer.terminate()
            writer.join(5)
    figures["ranks"] = float(args.ranks)
    figures["report_interval"] = args.report_interval
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(
            f"UI CPU while watching {args.ranks} ranks reporting every {args.report_interval:g} s: "
            f"{figures['cpu_percent_of_one_core']:.1f} % of one core over {figures['measured_seconds']:.0f} s "
            f"(target < {TARGET_PERCENT:g} %)\n"
            f"events read {figures['events_read']:.0f}, stale updates skipped "
            f"{figures['stale_updates_skipped']:.0f}, event-loop lag p95 {figures['loop_lag_p95_ms']:.1f} ms, "
            f"worst {figures['loop_lag_max_ms']:.1f} ms"
        )
    if args.check and figures["cpu_percent_of_one_core"] >= TARGET_PERCENT:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
