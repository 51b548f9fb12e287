"""Start a run: validate, make the run directory, start the launcher (docs/architecture.md).

Validating is ``plan_run`` (can this combination run here at all) and then
``engine.core.plan.resource_guard.check_resources`` (do its ranks fit in this machine's cores, memory and
GPUs); both refuse with a ConfigError before anything is created.

Plain Python: the CLI and the UI call this, and it never imports torch. The launcher
(``python -m engine.train.launch RUN_DIR``) runs as a child in a new session, so a closed terminal, a
dropped SSH link or a crashed UI does not kill training.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from engine.core.common.disk_space import write_failure
from engine.core.common.run_files import SpaceReserve, make_dirs, open_private, write_atomic
from engine.core.config.schema import RunConfig
from engine.core.config.toml_io import to_toml
from engine.core.host import gpus
from engine.core.plan.resource_guard import ResourceCheck, check_resources
from engine.core.plan.run_plan import RunPlan, plan_run
from engine.core.procs.run_proof import RunMarker
from engine.core.runs.run_info import Placement
from engine.core.runs.rundir import (
    RunDir,
    RunDirError,
    RunInfo,
    check_run_id,
    check_runs_dir,
    new_run_id,
)


class LauncherHandle(Protocol):
    """What follows a started run to its end: the launcher's ``Popen``, or (a run a scheduler
    places) a handle on its job that its backend gives."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


@dataclass
class StartedRun:
    """A run this process started (its launcher, or its scheduler's job). ``wait`` / ``poll``
    give its exit code."""

    run_dir: RunDir
    plan: RunPlan
    process: LauncherHandle
    # What the resource guard found: the estimate, the figures and the warnings.
    resources: ResourceCheck | None = None

    @property
    def run_id(self) -> str:
        return self.run_dir.run_id

    @property
    def warnings(self) -> tuple[str, ...]:
        """Sentences to show the user before following the run (a GPU other processes hold)."""
        return self.resources.warnings if self.resources is not None else ()

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)


def check_run(config: RunConfig, *, gpu_count: int | None = None) -> tuple[RunPlan, ResourceCheck]:
    """Plan ``config`` for this machine and check that its ranks fit; raises ConfigError
    (ResourceError for cores, memory or GPUs) with the reason. Creates nothing."""
    plan = plan_run(config, gpus.gpu_count() if gpu_count is None else gpu_count)
    return plan, check_resources(plan)


def prepare_run(
    config: RunConfig, runs_dir: Path, *, gpu_count: int | None = None, run_id: str | None = None
) -> tuple[RunDir, RunPlan]:
    """Check the config for this machine, then create the run directory with config.toml and
    run.json (state ``starting``). Raises ConfigError before creating anything."""
    plan, _ = check_run(config, gpu_count=gpu_count)
    run_dir, _ = create_run_dir(config, runs_dir, run_id, _local_info(config, plan))
    return run_dir, plan


def create_run_dir(
    config: RunConfig,
    runs_dir: Path,
    run_id: str | None,
    info: Callable[[RunDir], RunInfo],
    *,
    folders: tuple[str, ...] = (),
) -> tuple[RunDir, RunInfo]:
    """The run directory (with ``folders`` inside) holding the space reserve the launcher gives
    back for its summary, config.toml and run.json (``info`` of the new directory, returned with
    it), for a run of every backend alike. RunDirError (one sentence: the path, and the free
    space on a full disk) when it cannot be made; then nothing of it is left."""
    check_runs_dir(Path(runs_dir), write=True)
    if run_id is not None:
        check_run_id(run_id)
    run_dir = RunDir(Path(runs_dir) / (run_id or new_run_id(config.name)))
    try:
        run_dir.create()
        for folder in folders:
            make_dirs(run_dir.path / folder)
    except OSError as err:
        raise RunDirError(write_failure(run_dir.path, err)) from None
    try:
        SpaceReserve(run_dir.path).make()
        write_atomic(run_dir.config_path, to_toml(config))
        written = info(run_dir)
        run_dir.write_run_info(written)
    except OSError as err:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        sentence = write_failure(run_dir.path, err)
        raise RunDirError(f"the run could not start: {sentence}") from None
    return run_dir, written


def _local_info(
    config: RunConfig, plan: RunPlan, placement: Placement | None = None
) -> Callable[[RunDir], RunInfo]:
    """run.json of a run on this machine, before its launcher starts."""
    return lambda run_dir: replace(
        RunInfo.begun(
            run_dir.run_id, config.name, world_size=plan.world_size, devices=plan.devices.describe()
        ),
        placement=placement,
    )


def launcher_command(run_dir: RunDir, *extra: str) -> list[str]:
    return [sys.executable, "-m", "engine.train.launch", str(run_dir.path), *extra]


def start_run(
    config: RunConfig,
    runs_dir: Path,
    *,
    gpu_count: int | None = None,
    run_id: str | None = None,
    launcher_args: tuple[str, ...] = (),
    placement: Placement | None = None,
) -> StartedRun:
    """Validate ``config``, make its run directory and start its launcher in a new session.

    Returns at once; the run goes on without this process. Raises ConfigError (nothing started,
    nothing created) when the config cannot run here or its ranks do not fit; the resource
    guard's warnings are ``StartedRun.warnings``. ``placement``: run.json's, for a backend that
    runs its ranks under this machine's launcher but keeps the run as its own.
    """
    plan, resources = check_run(config, gpu_count=gpu_count)
    run_dir, _ = create_run_dir(config, runs_dir, run_id, _local_info(config, plan, placement))
    try:
        process = start_launcher(run_dir, *launcher_args)
    except RunDirError:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        raise
    return StartedRun(run_dir=run_dir, plan=plan, process=process, resources=resources)


def start_next_attempt(
    run_dir: RunDir,
    config: RunConfig,
    plan: RunPlan,
    resources: ResourceCheck | None,
    *,
    attempt: int,
    created: float,
    placement: Placement | None = None,
) -> StartedRun:
    """Start attempt ``attempt`` of the ended run in ``run_dir`` (``ddptui resume``; the attempt
    before it moved below attempts/ already): run.json names it (``starting``; its launcher has
    30 s from ``attempt_started`` to record itself), the space reserve is set aside again, and
    its launcher starts as a new run's does, reading the attempt from run.json. OSError or
    RunDirError when that cannot be done."""
    begun = RunInfo.begun(
        run_dir.run_id,
        config.name,
        world_size=plan.world_size,
        devices=plan.devices.describe(),
        created=created,
    )
    run_dir.write_run_info(
        replace(begun, attempt=attempt, attempt_started=time.time(), placement=placement)
    )
    SpaceReserve(run_dir.path).make()
    return StartedRun(run_dir, plan, start_launcher(run_dir), resources)


def start_launcher(run_dir: RunDir, *launcher_args: str) -> subprocess.Popen[bytes]:
    """The launcher of the run directory ``run_dir`` (config.toml and run.json made), in its own
    session, its output appended to logs/launcher.log (RunDirError when that cannot be made)."""
    try:
        log_fd = open_private(run_dir.launcher_log_path, "append")
    except OSError as err:
        raise RunDirError(write_failure(run_dir.launcher_log_path, err)) from None
    with os.fdopen(log_fd, "ab") as log:
        return subprocess.Popen(
            launcher_command(run_dir, *launcher_args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # The launcher carries the run marker (its id and its directory) from its first
            # instruction: `ddptui kill` and `clean` stop only processes that carry it, and
            # `ddptui ps` finds the run's directory from it, wherever it lies.
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                **RunMarker.of_dir(run_dir.path).environment(),
            },
        )
