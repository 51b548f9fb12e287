"""The waiter of a queued run: ``python -m engine.core.queue.waiter RUN_DIR --store DIR``.

Started detached by ``engine.core.queue.enqueue`` (its own session, the run marker in its
environment, recorded as the run's launcher). It polls: takes the store's lock, drops the claims
whose process is gone, and asks the line (``engine.core.queue.line.decide``) whether its claim may
start. When it may, it marks its claim holding and becomes the run's launcher in place
(``exec``: the same pid and start time, so its claim lasts exactly as long as the run's launcher).

SIGTERM (``ddptui kill``) removes its claim and settles the run as killed; ``--timeout`` seconds
in line settle it as failed, saying so. Plain Python: torch is loaded only by the launcher.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from engine.core.backends.local.start import launcher_command
from engine.core.common.run_files import write_atomic
from engine.core.common.statuses import RunStatus
from engine.core.config.toml_io import apply_overrides, to_toml
from engine.core.queue.claims import Claim, ClaimState, ClaimStore, open_store
from engine.core.queue.device_state import MachineWatcher
from engine.core.queue.line import decide
from engine.core.runs.rundir import RunDir
from engine.core.runs.settle import record_killed, settle_run
from engine.core.runs.stop_request import read_stop_request
from engine.core.runs.summarize import build_summary
from engine.core.runs.summary import Failure

POLL_SECONDS = 0.25  # a freed device is taken within this (the issue asks within 2 s)


class Removed(Exception):
    """The run was taken out of the line: SIGTERM (``ddptui kill``), or its claim was removed."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Removed(f"stopped by {signal.Signals(signum).name}")


def my_claim(claims: list[Claim], run_dir: RunDir) -> Claim | None:
    """This waiter's claim (its run, its pid: the start time is its own, being alive)."""
    return next(
        (c for c in claims if c.run_id == run_dir.run_id and c.waiter.pid == os.getpid()), None
    )


def take_turn(
    store: ClaimStore, run_dir: RunDir, watcher: MachineWatcher | None = None
) -> tuple[int, ...] | None:
    """One look at the line, under the lock: this run's devices, now marked held, when its turn
    has come; None while it waits. Removed when its claim is no longer in the store."""
    with store.locked():
        claims = store.live_claims()
        mine = next(
            (c for c in claims if c.run_id == run_dir.run_id and c.waiter.pid == os.getpid()), None
        )
        if mine is None:
            raise Removed("its claim was removed from the queue's store")
        waiting_for_gpus = any(
            c.want.kind == "gpu" for c in claims if c.state == ClaimState.WAITING
        )
        verdicts = decide(claims, (watcher or MachineWatcher()).state(gpus=waiting_for_gpus))
        verdict = next(v for v in verdicts if v.claim == mine)
        if not verdict.may_start or verdict.devices is None:
            return None
        store.write(mine.holding(verdict.devices))
        return verdict.devices


def wait_turn(
    store: ClaimStore,
    run_dir: RunDir,
    watcher: MachineWatcher,
    *,
    timeout: float | None = None,
    poll: float = POLL_SECONDS,
) -> tuple[int, ...] | None:
    """Poll until this run's turn comes (its devices) or ``timeout`` seconds pass (None)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        devices = take_turn(store, run_dir, watcher)
        if devices is not None:
            return devices
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(poll)


def pin_devices(run_dir: RunDir, devices: tuple[int, ...]) -> None:
    """A run that asked for any N GPUs runs on the ones it was given: config.toml says which."""
    config = run_dir.load_config()
    spec = "gpu:" + ",".join(str(i) for i in devices)
    if devices and config.devices.spec != spec:
        write_atomic(run_dir.config_path, to_toml(apply_overrides(config, {"devices.spec": spec})))


def leave_line(store: ClaimStore, run_dir: RunDir) -> None:
    with store.locked():
        mine = my_claim(store.read(), run_dir)
        if mine is not None:
            store.remove(mine)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.core.queue.waiter")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--ready-fd", type=int, default=None)
    args = parser.parse_args(argv)
    run_dir = RunDir(args.run_dir)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal does not end the wait
    if args.ready_fd is not None:  # whoever queued it returns once a kill would reach us here
        os.write(args.ready_fd, b"1")
        os.close(args.ready_fd)
    store = open_store(args.store, create=False)
    try:
        devices = wait_turn(store, run_dir, MachineWatcher(), timeout=args.timeout)
        if devices is None:
            leave_line(store, run_dir)
            why = f"it waited in the queue longer than its --queue-timeout ({args.timeout:g} s)"
            settle_run(
                run_dir,
                build_summary(run_dir, RunStatus.FAILED, Failure(rank=None, error=why), why),
            )
            return 1
        pin_devices(run_dir, devices)
    except Removed as removed:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        leave_line(store, run_dir)
        requester = read_stop_request(run_dir)
        record_killed(run_dir, f"{requester.sentence if requester else removed} while queued")
        return 1
    for restored in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the launcher's own
        signal.signal(restored, signal.SIG_DFL)
    command = launcher_command(run_dir)
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
