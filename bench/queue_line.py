"""What one look at the queue costs with 50 runs in line: the check every waiter makes at each
poll (``engine.core.queue.waiter.take_turn``: the store's lock, every claim read and its process
proved alive, the line decided), goal < 0.2 s.

    python bench/queue_line.py                  # 50 claims, 20 timed checks of each line
    python bench/queue_line.py --claims 200 --repeat 50
    python bench/queue_line.py --json

Each claim's waiter is a real process (``sleep``), so every check proves 50 processes by pid and
start time, as a real line does. The check is timed for the last claim in line, which waits
(nothing changes between checks), on two lines:

- CPU: one run holds the machine's CPU slots, the 49 others wait for them; no GPU is looked at.
- GPU: 50 runs want GPUs of eight stand-in cards (NVML's answer given, as the tests do), one of
  them held by a process of this bench through a stand-in device file: each check also scans
  every process's open files for the device holders and joins them with NVML, as the GPUs screen
  does (the dearest part; it grows with the processes on the machine, counted in the output).

The baseline, measured the same way in the same run, is the floor of any decision from the store:
the lock taken, the directory listed and every claim file read and parsed (no process proved, no
decision).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from engine.core.host.gpus import GpuInventory, GpuSample  # noqa: E402
from engine.core.procs.process_identity import ProcessRef, identify  # noqa: E402
from engine.core.queue.claims import Claim, ClaimStore, DeviceWant, open_store  # noqa: E402
from engine.core.queue.device_state import MachineWatcher  # noqa: E402
from engine.core.queue.waiter import take_turn  # noqa: E402
from engine.core.runs.rundir import RunDir  # noqa: E402

GOAL_SECONDS = 0.2
GIB = 2**30
EIGHT_CARDS = GpuInventory(
    gpus=tuple(
        GpuSample(
            i, "NVIDIA H100 80GB HBM3", memory_used_bytes=GIB // 2, memory_total_bytes=80 * GIB
        )
        for i in range(8)
    ),
    driver_version="550.54",
)


def fill_store(store: ClaimStore, waiters: list[ProcessRef], kind: str, last: ProcessRef) -> None:
    """``len(waiters)`` claims, the first holding its devices, the last the bench's own."""
    refs = [*waiters[:-1], last]
    for ticket, ref in enumerate(refs, start=1):
        if kind == "cpu":
            want = DeviceWant("cpu", 2)
        else:
            want = DeviceWant("gpu", 2, ()) if ticket % 2 else DeviceWant("gpu", 1, (ticket % 8,))
        claim = Claim(ticket, f"run-{ticket:04d}", f"/nowhere/run-{ticket:04d}", want, ref, 0.0)
        store.write(
            claim.holding((0, 1) if kind == "gpu" else ()) if ticket == 1 else claim, new=True
        )


def floor_check(store: ClaimStore) -> None:
    """The baseline: the lock, the listing, every claim file read and parsed."""
    fd = os.open(store.path / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for name in sorted(os.listdir(store.path)):
            if name.endswith(".json"):
                with open(store.path / name, "rb") as claim:
                    json.loads(claim.read())
    finally:
        os.close(fd)


def median_seconds(check: Callable[[], object], repeat: int) -> float:
    check()  # warm: the first scan primes psutil's caches, as a waiter's first poll does
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        check()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(kind: str, claims: int, repeat: int, top: Path) -> dict[str, float | int]:
    devices = top / f"dev-{kind}"
    devices.mkdir()
    for i in range(8):
        (devices / f"nvidia{i}").write_text("")
    waiters = [subprocess.Popen(["sleep", "3600"]) for _ in range(claims)]
    # A process of anyone on GPU 5 (this bench, through its stand-in device file).
    with open(devices / "nvidia5") as _held:
        try:
            refs = [identify(w.pid) for w in waiters]
            me = identify(os.getpid())
            assert me is not None and all(refs)
            store = open_store(top / f"claims-{kind}")
            fill_store(store, [r for r in refs if r is not None], kind, me)
            watcher = MachineWatcher(str(devices / "nvidia*"), EIGHT_CARDS)
            run_dir = RunDir(Path(f"/nowhere/run-{claims:04d}"))
            assert take_turn(store, run_dir, watcher) is None, "the last in line may not start"
            check = median_seconds(lambda: take_turn(store, run_dir, watcher), repeat)
            floor = median_seconds(lambda: floor_check(store), repeat)
            processes = len(psutil.pids())  # what the GPU line's holder scan walks
        finally:
            for waiter in waiters:
                waiter.kill()
            for waiter in waiters:
                waiter.wait()
    return {"check_s": check, "floor_s": floor, "ratio": check / floor, "processes": processes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddptui-queue-bench-") as top:
        results = {
            kind: measure(kind, args.claims, args.repeat, Path(top)) for kind in ("cpu", "gpu")
        }
    facts = {
        "claims": args.claims,
        "repeat": args.repeat,
        "load_average": os.getloadavg()[0],
        "goal_s": GOAL_SECONDS,
        **results,
    }
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        print(
            f"{args.claims} claims in line, median of {args.repeat} checks, "
            f"{results['gpu']['processes']} processes on the machine (the waiters included), "
            f"load {facts['load_average']:.2f}"
        )
        for kind, got in results.items():
            verdict = "ok" if got["check_s"] < GOAL_SECONDS else "OVER THE GOAL"
            print(
                f"  {kind.upper()} line: {got['check_s'] * 1000:.1f} ms per check "
                f"(floor: lock + listing + parse {got['floor_s'] * 1000:.2f} ms, "
                f"ratio {got['ratio']:.0f}); goal < {GOAL_SECONDS * 1000:.0f} ms: {verdict}"
            )
    return 0 if all(r["check_s"] < GOAL_SECONDS for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
