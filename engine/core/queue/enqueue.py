"""Queue a run (``ddptui run TARGET --queue`` and the launch form's "when free"): check it as any
run is checked, make its run directory (state ``queued``), start its waiter detached and put its
claim in line, all before returning; nothing is made when any of it is refused (one sentence).

The waiter (``python -m engine.core.queue.waiter``) is started as a launcher is: in its own
session, carrying the run marker, recorded in run.json as the run's launcher. It becomes the
launcher in place (same pid and start time), so ``ddptui kill``, the observer and the claim all go
by one process from the queue to the run's end. Plain Python.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from engine.core.backends.local.start import check_run, create_run_dir
from engine.core.common.config_error import ConfigError
from engine.core.common.disk_space import write_failure
from engine.core.common.run_files import open_private
from engine.core.common.statuses import RunStatus
from engine.core.config.devices import SPEC_KEY, parse_device_spec
from engine.core.config.schema import RunConfig
from engine.core.plan.run_plan import RunPlan
from engine.core.procs.process_identity import identify
from engine.core.procs.run_proof import RunMarker
from engine.core.queue.claims import Claim, ClaimStore, DeviceWant, default_store_path, open_store
from engine.core.queue.device_state import cpu_slots
from engine.core.queue.line import Verdict
from engine.core.queue.standing import verdict_of
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo

WAITER_READY_SECONDS = 30.0  # a loaded machine starts Python slowly


@dataclass(frozen=True)
class QueuedRun:
    """A run accepted into the line: its directory, its claim and where it stands now."""

    run_dir: RunDir
    plan: RunPlan
    claim: Claim
    verdict: Verdict | None  # None: it had already left the line when looked at
    # The waiter, this process's child: polling it reaps it (the UI keeps it; the CLI exits).
    process: subprocess.Popen[bytes] | None = None

    @property
    def run_id(self) -> str:
        return self.run_dir.run_id

    def poll(self) -> int | None:
        return self.process.poll() if self.process is not None else None


def want_of(config: RunConfig, plan: RunPlan) -> DeviceWant:
    """What the run waits for: a GPU count waits for any that many free GPUs, named GPUs for
    those, CPU ranks for that many of the machine's CPU slots (ConfigError when it has fewer)."""
    if plan.devices.kind == "cpu":
        slots = cpu_slots()
        if plan.devices.cpu_ranks > slots:
            raise ConfigError(
                f"devices.spec {config.devices.spec!r} asks for {plan.devices.cpu_ranks} CPU slots, "
                f"but this machine's queue has {slots}; ask for at most cpu:{slots}",
                key=SPEC_KEY,
                reason=f"needs {plan.devices.cpu_ranks} CPU slots, {slots} here",
            )
        return DeviceWant("cpu", plan.devices.cpu_ranks)
    spec = parse_device_spec(config.devices.spec)
    indices = plan.devices.gpu_indices
    return DeviceWant("gpu", len(indices), indices if spec.kind in ("gpus", "all") else ())


def check_queueing(config: RunConfig, plan: RunPlan, store_path: Path | None = None) -> DeviceWant:
    """What ``queue_run`` checks beyond the plan, making nothing (the launch form's check): the
    devices the run would wait for (ConfigError when the machine has fewer) and the claim store,
    where it exists already (ClaimStoreError when it cannot be trusted)."""
    want = want_of(config, plan)
    path = store_path if store_path is not None else default_store_path()
    if os.path.lexists(path):
        open_store(path, create=False)
    return want


def queue_run(
    config: RunConfig,
    runs_dir: Path,
    *,
    store_path: Path | None = None,
    timeout: float | None = None,
    gpu_count: int | None = None,
    run_id: str | None = None,
) -> QueuedRun:
    """Check ``config`` for this machine, then queue it (see the module docstring). ConfigError
    (ClaimStoreError, ResourceError) or RunDirError with one sentence: nothing queued or made."""
    plan, _ = check_run(config, gpu_count=gpu_count)
    want = want_of(config, plan)
    store = open_store(store_path)
    info = _queued_info(config, plan)
    run_dir, written = create_run_dir(config, runs_dir, run_id, info)
    try:
        claim, process = _start_waiter(store, run_dir, want, config, timeout)
    except OSError as err:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        raise RunDirError(
            f"the run could not be queued: {write_failure(run_dir.path, err)}"
        ) from None
    except RuntimeError as err:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        raise RunDirError(f"the run could not be queued: {err}") from None
    run_dir.write_run_info(replace(written, launcher=claim.waiter, pgid=claim.waiter.pid))
    return QueuedRun(run_dir, plan, claim, verdict_of(store, claim.run_id), process)


def _queued_info(config: RunConfig, plan: RunPlan) -> Callable[[RunDir], RunInfo]:
    """run.json of a queued run, before its waiter is recorded as its launcher."""
    return lambda run_dir: RunInfo.begun(
        run_dir.run_id,
        config.name,
        world_size=plan.world_size,
        devices=plan.devices.describe(),
        state=RunStatus.QUEUED,
    )


def waiter_command(
    run_dir: RunDir, store: ClaimStore, timeout: float | None, ready_fd: int
) -> list[str]:
    command = [sys.executable, "-m", "engine.core.queue.waiter", str(run_dir.path)]
    command += ["--store", str(store.path), "--ready-fd", str(ready_fd)]
    return command + (["--timeout", f"{timeout:g}"] if timeout is not None else [])


def _start_waiter(
    store: ClaimStore, run_dir: RunDir, want: DeviceWant, config: RunConfig, timeout: float | None
) -> tuple[Claim, subprocess.Popen[bytes]]:
    """Start the waiter and write its claim under the store's lock: the waiter's first look,
    which takes the lock too, finds its claim there."""
    log_fd = open_private(run_dir.launcher_log_path, "append")
    ready_read, ready_write = os.pipe()
    with store.locked(), os.fdopen(log_fd, "ab") as log:
        process = subprocess.Popen(
            waiter_command(run_dir, store, timeout, ready_write),
            pass_fds=(ready_write,),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a closed terminal does not end the wait
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                **RunMarker.of_dir(run_dir.path).environment(),
            },
        )
        ref = identify(process.pid)
        if ref is None:
            raise RuntimeError(f"the waiter (pid {process.pid}) ended at once; see {log.name}")
        claim = Claim(
            ticket=store.next_ticket(store.read()),
            run_id=run_dir.run_id,
            run_dir=os.path.realpath(run_dir.path),
            want=want,
            waiter=ref,
            queued_at=time.time(),
            label=config.script.label if config.script.given else config.name,
            uid=os.geteuid(),
        )
        store.write(claim, new=True)
    os.close(ready_write)
    try:
        _wait_ready(ready_read, process, log.name)
    except RuntimeError:
        store.remove(claim)
        raise
    return claim, process


def _wait_ready(ready_read: int, process: subprocess.Popen[bytes], log_name: str) -> None:
    """Return once the waiter has set up its signals (a kill from now on settles the run as
    killed while queued); RuntimeError when it ends or hangs first."""
    with os.fdopen(ready_read, "rb") as ready:
        readable, _, _ = select.select([ready], [], [], WAITER_READY_SECONDS)
        if not readable or not ready.read(1):
            process.kill()
            raise RuntimeError(f"the waiter (pid {process.pid}) did not start; see {log_name}")
