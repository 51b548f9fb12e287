"""Slurm's word on one job: its state (pending with the reason, running, how it ended), its nodes
and times, from ``squeue --json`` while Slurm keeps it in the queue, then from its final record
(``sacct`` where accounting exists, ``sacct -c`` where only job completion files do).

Plain Python. ``squeue --json`` of Slurm 22.05 ignores ``-j`` and ``-t`` and lists every job, so the
job is picked out here; one listing serves every run asked about within ``QUEUE_TTL_SECONDS``
(``ddptui runs`` of many Slurm runs asks once). Nothing here raises: a Slurm that cannot be asked
is a ``JobLookup`` with ``problem`` set.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from engine.core.backends.slurm.cluster import (
    SlurmUnavailable,
    expand_hostlist,
    read_json,
    run_slurm,
)

QUEUE_TTL_SECONDS = 2.0


class JobState(str, Enum):
    """Slurm's job states (``squeue``'s JOB_STATE, ``sacct``'s State), as Slurm spells them."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    CONFIGURING = "CONFIGURING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    UNKNOWN = "UNKNOWN"

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def of(cls, text: object) -> JobState:
        """The state in ``text`` ("CANCELLED by 0" reads as CANCELLED); UNKNOWN for other words."""
        word = str(text or "").split()[0].upper() if str(text or "").split() else ""
        try:
            return cls(word)
        except ValueError:
            return cls.UNKNOWN

    @property
    def ended(self) -> bool:
        """Slurm is done with it: nothing of it runs any more."""
        return self in ENDED_STATES

    @property
    def alive(self) -> bool:
        """Waiting or running: the job has not ended."""
        return self not in ENDED_STATES and self != JobState.UNKNOWN


ENDED_STATES = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.OUT_OF_MEMORY,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
    }
)


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm reports it. Times are Unix seconds (None when Slurm gives none)."""

    job_id: str
    state: JobState
    reason: str = ""  # why it pends (Priority, Resources, BeginTime ...); "" when none
    nodes: tuple[str, ...] = ()
    start_time: float | None = None  # the expected start while it pends
    end_time: float | None = None
    time_limit_minutes: int | None = None  # None: no limit (or not said)
    exit_code: str = ""  # "0:0" (code:signal), from the final record
    source: str = "squeue"  # squeue | sacct | sacct -c
    # the times Slurm requeued it (a node failure of a job submitted with --requeue): squeue's
    # restart count, which the job's batch script sees as SLURM_RESTART_COUNT
    restarts: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": str(self.state),
            "reason": self.reason,
            "nodes": list(self.nodes),
            "start_time": self.start_time,
            "end_time": self.end_time,
            "time_limit_minutes": self.time_limit_minutes,
            "exit_code": self.exit_code,
            "source": self.source,
            "restarts": self.restarts,
        }


@dataclass(frozen=True)
class JobLookup:
    """What asking Slurm about a job found: the job, or None with ``problem`` when Slurm could not
    be asked (None with no problem: Slurm has no record of it)."""

    job: SlurmJob | None
    problem: str = ""


def _time(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _from_squeue(raw: dict[str, Any]) -> SlurmJob:
    reason = str(raw.get("state_reason") or "")
    limit = raw.get("time_limit")
    restarts = raw.get("restart_cnt")
    return SlurmJob(
        job_id=str(raw.get("job_id")),
        state=JobState.of(raw.get("job_state")),
        reason="" if reason == "None" else reason,
        nodes=expand_hostlist(str(raw.get("nodes") or "")),
        start_time=_time(raw.get("start_time")),
        end_time=_time(raw.get("end_time")),
        time_limit_minutes=limit if isinstance(limit, int) and limit > 0 else None,
        source="squeue",
        restarts=restarts if isinstance(restarts, int) and restarts > 0 else 0,
    )


class SlurmQueue:
    """``squeue --json``, asked at most once per ``ttl`` seconds for every caller in this process."""

    def __init__(self, ttl: float = QUEUE_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._asked = 0.0
        self._jobs: dict[str, dict[str, Any]] = {}
        self._problem = ""

    def _refresh(self) -> None:
        now = time.monotonic()
        if self._asked and now - self._asked < self.ttl:
            return
        self._asked = now
        try:
            jobs = read_json("squeue").get("jobs") or []
        except SlurmUnavailable as err:
            self._jobs, self._problem = {}, str(err)
            return
        self._jobs = {str(j.get("job_id")): j for j in jobs if isinstance(j, dict)}
        self._problem = ""

    def job(self, job_id: str) -> JobLookup:
        with self._lock:
            self._refresh()
            raw = self._jobs.get(job_id)
            if raw is not None:
                return JobLookup(_from_squeue(raw))
            return JobLookup(None, self._problem)

    def forget(self) -> None:
        """Ask again next time (after this process changed a job: submitted, cancelled)."""
        with self._lock:
            self._asked = 0.0


QUEUE = SlurmQueue()
_FIELDS = "jobid,state,nodelist,exitcode,start,end,timelimit"


def _from_sacct(line: str, source: str) -> SlurmJob | None:
    fields = line.strip().split("|")
    if len(fields) < 6 or not fields[0] or "." in fields[0]:  # job steps have an id with a dot
        return None
    start, end = (_sacct_time(f) for f in fields[4:6])
    return SlurmJob(
        job_id=fields[0],
        state=JobState.of(fields[1]),
        nodes=expand_hostlist(fields[2]) if fields[2] not in ("", "None assigned") else (),
        exit_code=fields[3],
        start_time=start,
        end_time=end,
        source=source,
    )


def _sacct_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def final_record(job_id: str) -> JobLookup:
    """The job's record once it left the queue: ``sacct`` (accounting), else ``sacct -c`` (job
    completion files); None when neither has it. A job Slurm requeued has a record of each
    time it ran: the last is how it ended."""
    problems = []
    for source, extra in (("sacct", ["-X"]), ("sacct -c", ["-c"])):
        try:
            done = run_slurm("sacct", *extra, "-j", job_id, "-n", "-P", "-o", _FIELDS)
        except SlurmUnavailable as err:
            problems.append(str(err))
            continue
        found = [_from_sacct(line, source) for line in done.stdout.splitlines()]
        mine = [job for job in found if job is not None and job.job_id == job_id]
        return JobLookup(mine[-1] if mine else None)  # None: Slurm was asked and has no record
    return JobLookup(None, "; ".join(problems))


class FinalRecords:
    """``final_record`` for every caller in this process, asked at most once per ``ttl`` seconds
    for one job (as ``SlurmQueue`` asks ``squeue``): a run's follower, its observer and every
    screen's poll would otherwise each run ``sacct`` (twice, each with a timeout, when Slurm does
    not answer). Nothing is kept longer: a test cluster started afresh reuses job ids."""

    def __init__(self, ttl: float = QUEUE_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._recent: dict[str, tuple[float, JobLookup]] = {}

    def record(self, job_id: str) -> JobLookup:
        with self._lock:
            now = time.monotonic()
            asked = self._recent.get(job_id)
            if asked is not None and now - asked[0] < self.ttl:
                return asked[1]
            found = final_record(job_id)
            self._recent = {k: v for k, v in self._recent.items() if now - v[0] < self.ttl}
            self._recent[job_id] = (time.monotonic(), found)
            return found


FINAL_RECORDS = FinalRecords()


def read_job(
    job_id: str, queue: SlurmQueue = QUEUE, records: FinalRecords = FINAL_RECORDS
) -> JobLookup:
    """Slurm's word on ``job_id``: the queue's while it is there (finished jobs stay for MinJobAge),
    else the final record."""
    found = queue.job(job_id)
    if found.job is not None:
        return found
    record = records.record(job_id)
    if record.job is None and found.problem:
        return JobLookup(None, found.problem)
    return record
