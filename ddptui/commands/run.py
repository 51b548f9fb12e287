"""``ddptui run PRESET`` / ``ddptui run script.py -- ARGS`` / ``ddptui run -m module -- ARGS``:
launch a run and follow it to its result line."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import click

from ddptui.backend_options import PlacementAsked, backend_options, teaching_lines
from ddptui.cli_common import echo, fail, follow_options
from ddptui.run_options import collect_overrides, override_options
from ddptui.script_target import script_config
from ddptui.terminal_progress import (
    ProgressPrinter,
    follow_with_progress,
    followed_to_the_end,
)
from engine.core.backends.local.start import StartedRun
from engine.core.backends.registry import LOCAL, backend_for
from engine.core.common.visible_text import visible
from engine.core.config.faults import EVERY_ATTEMPT, FAULT_EFFECTS
from engine.core.config.presets import load_preset
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.config.toml_io import apply_overrides
from engine.core.queue.enqueue import QueuedRun, queue_run
from engine.core.runs.placement import watch_for
from engine.core.runs.rundir import RunDirError

# Shortcuts that set the engine's own workload: a script has its own options, after --.
ENGINE_ONLY = ("epochs", "max_steps", "batch_size", "precision", "data", "model", "seed")


def base_config(target: str | None, module: str | None, script_args: tuple[str, ...]) -> RunConfig:
    """The config a run starts from: a preset, or the user's script or module with its args."""
    script = script_config(target, script_args, module=module)
    if script is not None:
        return script
    if script_args:
        raise ConfigError(
            f"arguments after the preset ({' '.join(script_args)}) are for a script's own "
            "options; give a script (train.py or -m package.module) to pass them"
        )
    if target is None:
        raise ConfigError("give a preset, a script (train.py) or -m package.module")
    return load_preset(target)


def run_config(
    base: RunConfig, set_values: tuple[str, ...], faults: tuple[str, ...], shortcuts: dict[str, Any]
) -> RunConfig:
    """``base`` with the command line's overrides; a script refuses the engine's shortcuts."""
    if base.script.given:
        given = [f"--{n.replace('_', '-')}" for n in ENGINE_ONLY if shortcuts.get(n) is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} set the engine's own workload; your script takes its "
                "own options after --"
            )
    overrides = collect_overrides(set_values, **shortcuts)
    if faults:
        overrides["faults"] = list(faults)
    return apply_overrides(base, overrides)


# `ddptui run --help`; each backend teaches itself where it says {backends}.
RUN_HELP = """Launch a preset (a name from `ddptui presets` or a .toml path), or your own training
script, and follow it.

\b
Examples:
  ddptui run cpu-demo
  ddptui run cpu-demo --devices cpu:4 --epochs 1 --max-steps 50
  ddptui run seed-ddp --devices 0,2 --set optimizer.lr_scaling=linear
  ddptui run cpu-demo --fault crash:1:3        # watch a rank fail on purpose
  ddptui run cpu-demo --epochs 3 --fault crash:1:60 --max-restarts 1
                                               # fail, then go on from the last checkpoint
  ddptui run cpu-demo --fault kill-launcher:0:5  # a launcher lost mid-run: summary "lost"
  ddptui run cpu-demo --devices cpu:16 --oversubscribe   # more than 4 ranks per core
  ddptui run my.toml --set model.factory=mynets:build   # your model in the engine's loop

\b
Your own script, as torchrun would start it (one process per device, RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), its own arguments after --:
  ddptui run train.py --devices 0,1 -- --epochs 10 --lr 0.1
  ddptui run -m mypackage.train --devices cpu:2 -- --epochs 1
Its progress shows with no change to it (optimizer steps, its tqdm bars); calling
ddptui.report(loss=..., accuracy=..., images_per_s=...) adds those figures.

{backends}

\b
On a shared machine, queue it: it starts when its devices are free, in order (see
`ddptui queue`); --devices 2 takes any two free GPUs, 0,2 waits for those:
  ddptui run train.py --devices 2 --queue -- --epochs 10

\b
Restarts and resuming: with --max-restarts a failed attempt starts again in the same run
directory from its newest checkpoint (training.checkpoint_every, and every epoch end); your
script is started again with TORCHELASTIC_RESTART_COUNT set, and, where the preset names its
option (script.resume_arg = "--resume"), that option and the newest file it wrote in
$DDPTUI_CHECKPOINT_DIR. A run that failed, was killed, was lost or was ended by its
scheduler goes on with
`ddptui resume RUN`. `ddptui show RUN` lists every attempt.

The run starts in its own session: closing this terminal does not stop it (see `ddptui runs`).
Ctrl-C stops the run. Exit code 0 when the run completed, 1 when it failed or was killed,
2 for bad input or a run whose ranks do not fit in this machine's cores, memory or GPUs
(nothing started).
"""


@click.command("run", help=inspect.cleandoc(RUN_HELP).replace("{backends}", teaching_lines()))
@click.argument("target", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "-m",
    "module",
    metavar="PACKAGE.MODULE",
    help="Run this module as the script, as python -m does (its arguments after --).",
)
@override_options
@click.option(
    "--fault",
    "faults",
    multiple=True,
    metavar="KIND:RANK:STEP[:ATTEMPTS]",
    help="Inject a fault for testing on RANK at global STEP (repeatable): "
    + "; ".join(f"{kind} ({effect})" for kind, effect in FAULT_EFFECTS.items())
    + f". It fires in the run's first attempt only; ATTEMPTS makes it fire again after a restart "
    f"or resume: a count (the first N attempts) or {EVERY_ATTEMPT}.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    metavar="N",
    help="On a rank failure, or a rank stalled past the stall rule (its stacks taken first), stop "
    "every rank and start again from the last checkpoint (step 0 without one), up to N times, "
    "waiting longer before each (supervision.max_restarts, restart_backoff_seconds); the same "
    "error at the same step twice stops restarting. On a scheduler's nodes a lost node restarts "
    "it too.",
)
@follow_options("the run (it keeps running)")
@click.option(
    "--queue",
    "queue",
    is_flag=True,
    help="Wait in this machine's queue until the devices are free, then start (returns at once).",
)
@click.option(
    "--queue-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="With --queue: give up (failed) after waiting this long.",
)
@click.option(
    "--queue-store",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="With --queue: the claim store every user of the machine shares "
    "(default $DDPTUI_CLAIMS_DIR or /tmp/ddptui-claims).",
)
@backend_options
def run_command(
    target: str | None,
    script_args: tuple[str, ...],
    module: str | None,
    set_values: tuple[str, ...],
    runs_dir: Path,
    faults: tuple[str, ...],
    as_json: bool,
    detach: bool,
    queue: bool,
    queue_timeout: float | None,
    queue_store: Path | None,
    placement: PlacementAsked,
    **shortcuts: Any,
) -> None:
    try:
        config = run_config(base_config(target, module, script_args), set_values, faults, shortcuts)
        placed = placement.overrides()
        if placed:
            config = apply_overrides(config, placed)
        where = placement.backend
        if queue and where is not LOCAL:
            raise ConfigError(
                f"--queue is for this machine; on {where.title}, {where.title} queues the job"
            )
        if (queue_timeout is not None or queue_store is not None) and not queue:
            raise ConfigError("--queue-timeout and --queue-store need --queue")
        if queue:
            queued = queue_run(config, runs_dir, store_path=queue_store, timeout=queue_timeout)
            echo(queued.run_id if detach else queued_line(queued))
            return
        started = where.start(config, runs_dir)
    except (ConfigError, RunDirError) as err:
        fail(str(err))
    for warning in started.warnings:
        echo(f"ddptui: warning: {warning}", err=True)
    if detach:
        echo(started.run_id)
        return
    sys.exit(follow_to_the_end(started, config, as_json))


def queued_line(queued: QueuedRun) -> str:
    """What `ddptui run --queue` says: where the run stands in line, and why it waits."""
    verdict = queued.verdict
    head = f"run {queued.run_id} queued for {queued.claim.want.describe()}"
    if verdict is None or verdict.may_start or verdict.place == 0:
        return f"{head}: starting now (ddptui show {queued.run_id})"
    return (
        f"{head}, number {verdict.place} in line: {visible(verdict.reason, one_line=True)}\n"
        f"it starts when they are free (ddptui queue; ddptui kill {queued.run_id} removes it)"
    )


def follow_to_the_end(started: StartedRun, config: RunConfig, as_json: bool) -> int:
    """Follow the run with its progress (on stderr with ``--json``) to its result line or its
    summary.json; the exit code it ends with."""
    out = sys.stderr if as_json else sys.stdout
    if not as_json:
        info = started.run_dir.read_run_info()
        ranks = info.world_size or "?"
        what = (
            f"{config.script.label} as {ranks} ranks"
            if config.script.given
            else f"{config.strategy.name} {config.precision.mode}"
        )
        watch = watch_for(info)  # a backend that placed it elsewhere: the plan is one node's share
        placed = watch.recorded(started.run_dir, info) if watch is not None else None
        nodes = info.nnodes if placed else 1
        batch = "" if config.script.given else f", global batch {started.plan.global_batch * nodes}"
        where = info.devices if placed else started.plan.devices.describe()
        label = f", {backend_for(info).title} {placed.label}" if placed and placed.label else ""
        echo(f"run {started.run_id}: {what} on {where}{batch}{label}", err=as_json)
    epochs = 0 if config.script.given else config.training.epochs  # a script knows its own
    printer = ProgressPrinter(started.run_dir, epochs, out=out)
    result = follow_with_progress(
        started, printer, on_interrupt="stopping the run; wait for its summary"
    )
    return followed_to_the_end(started, result, as_json)
