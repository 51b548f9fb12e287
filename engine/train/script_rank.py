"""One rank of the user's own training script: ``python -m engine.train.script_rank RUN_DIR RANK``.

The launcher starts one per device with the torchrun contract in the environment (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES) and the
rank's log as its stdout and stderr. Before the script runs, this rank bootstraps like every engine
rank (dies with its launcher, answers a stack-dump signal), then arranges to report progress with
no change to the script:

- once the script imports torch's optimizers, a global optimizer step hook
  (``torch.optim.optimizer.register_optimizer_step_post_hook``) counts steps and their time;
- with it, the step timer (``engine.train.step_timing``) splits steps into data wait, forward,
  backward, optimizer and other through the global optimizer and module hooks, changing nothing
  of the model;
- the progress bars it prints (tqdm's ``n/total [..., rate]``) give the epoch fraction;
- ``ddptui.report(**metrics)``, where the script calls it, adds loss, accuracy, images/s.

The script then runs as ``python script.py ARGS`` (or ``python -m module ARGS``) would run it; in
an attempt that goes on from the script's own checkpoint, ``script.resume_arg`` and that
checkpoint's path follow ARGS (``engine.core.runs.resume_point`` says which file). An
exception is reported as the rank's failure with its traceback; its exit code is this process's.
Torch is never imported here: the script imports it, or not.
"""

from __future__ import annotations

if __name__ == "__main__":
    # First, before anything else: tie this rank to its launcher and make its stack askable.
    from engine.train.rank_bootstrap import bootstrap_rank

    bootstrap_rank()

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.core.common.run_environment import RESUME_FROM_ENV
from engine.core.config.schema import RunConfig
from engine.core.config.toml_io import load_config
from engine.core.runs.events import (
    EventWriter,
    RankFailed,
    RankFinished,
    RankStarted,
    one_line_error,
)
from engine.core.runs.rundir import RunDir, this_host
from engine.core.runs.script_reporting import BarReader, ScriptReporter, install
from engine.train.rank_bootstrap import exit_at_once
from engine.train.step_timing import StepTimer, clock_for_this_process

OPTIMIZER_MODULE = "torch.optim.optimizer"
RENDEZVOUS_MODULE = "torch.distributed.rendezvous"


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after ``name`` is imported, by whoever imports it, without
    importing it first."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; and the finders below answer from here on
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module
        callback = self.callback

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            callback(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def hook_optimizer_steps(
    reporter: ScriptReporter, timer: StepTimer | None
) -> Callable[[ModuleType], None]:
    def register(optimizer_module: ModuleType) -> None:
        def after_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
            lr = None
            with contextlib.suppress(Exception):  # an optimizer without an lr in group 0
                lr = float(optimizer.param_groups[0]["lr"])
            reporter.on_step(lr)

        optimizer_module.register_optimizer_step_post_hook(after_step)
        if timer is not None:  # torch.nn is imported before torch.optim
            timer.install(optimizer_module, sys.modules["torch.nn.modules.module"])

    return register


def meet_at_the_launchers_store(rendezvous_module: ModuleType) -> None:
    """env:// (the script's ``init_process_group``) meets at the launcher's store: a file store in
    the run directory on one node, so the script's rank 0 listens on no TCP port for it."""
    # Imported here, not above: torch is being imported by the script at this moment, and this
    # process never imports torch before the script does.
    from engine.train.rendezvous import route_env_rendezvous

    route_env_rendezvous(rendezvous_module)


def rank_device() -> tuple[str, int | None]:
    """("cuda:<local rank>", its NVML index) on a GPU run, ("cpu", None) on a CPU run."""
    visible = [
        v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()
    ]
    if not visible:
        return "cpu", None
    local = int(os.environ.get("LOCAL_RANK", "0"))
    entry = visible[local] if local < len(visible) else ""
    return f"cuda:{local}", int(entry) if entry.isdigit() else None


def script_args(config: RunConfig, resume_from: str) -> list[str]:
    """The script's arguments: the preset's, then, in an attempt that goes on from a checkpoint
    (``resume_from``, set by the launcher) where the preset names its option
    (``script.resume_arg``), that option and the checkpoint's path ("--resume=PATH" when the
    option ends in "=")."""
    script = config.script
    if not (resume_from and script.resume_arg):
        return list(script.args)
    if script.resume_arg.endswith("="):
        return [*script.args, f"{script.resume_arg}{resume_from}"]
    return [*script.args, script.resume_arg, resume_from]


def run_script(config: RunConfig) -> None:
    """The script as ``python script.py ARGS`` or ``python -m module ARGS`` runs it."""
    script = config.script
    args = script_args(config, os.environ.get(RESUME_FROM_ENV, ""))
    if script.path:
        path = str(Path(script.path).expanduser().resolve())
        sys.argv = [path, *args]
        sys.path.insert(0, str(Path(path).parent))
        runpy.run_path(path, run_name="__main__")
    else:
        sys.argv = [script.module, *args]
        runpy.run_module(script.module, run_name="__main__", alter_sys=True)


def exit_code(err: SystemExit) -> int:
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)  # sys.exit("message"), as Python prints it
    return 1


def main(argv: Sequence[str]) -> int:
    run_dir, rank = RunDir(Path(argv[0])), int(argv[1])
    config = load_config(run_dir.config_path)
    events = EventWriter(run_dir.rank_events_path(rank))
    reporter = ScriptReporter(events, rank, config.training.report_interval)
    install(reporter)
    timer = (
        StepTimer(events, rank, config.training.report_interval, make_clock=clock_for_this_process)
        if config.training.step_timing
        else None
    )
    device, gpu = rank_device()
    events.write(
        RankStarted(
            rank=rank,
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            pid=os.getpid(),
            host=this_host(),
            device=device,
            gpu_index=gpu,
        )
    )
    sys.meta_path.insert(0, AfterImport(OPTIMIZER_MODULE, hook_optimizer_steps(reporter, timer)))
    sys.meta_path.insert(0, AfterImport(RENDEZVOUS_MODULE, meet_at_the_launchers_store))
    sys.stdout = BarReader(sys.stdout, reporter)
    sys.stderr = BarReader(sys.stderr, reporter)
    code = 0
    try:
        run_script(config)
    except SystemExit as err:
        code = exit_code(err)
    except BaseException as err:
        error = one_line_error(err)
        events.write(RankFailed(rank=rank, error=error, traceback=traceback.format_exc()))
        traceback.print_exc()
        code = 1
    reporter.flush()
    if timer is not None:
        if code == 0:
            timer.flush()
        timer.close()
    if code == 0:
        events.write(RankFinished(rank=rank))
    events.close()
    return code


if __name__ == "__main__":
    # Threads the script left running must not keep the rank alive after its main code returned.
    exit_at_once(main(sys.argv[1:]))
