"""Every status vocabulary of ddptui, as enums: a run's, a rank's, a training job's, a process's role.

They are ``str``-valued, so the JSON files (run.json ``state``, summary.json ``status``, the
``--json`` outputs) hold the same plain words as before, and a member compares equal to its word.
``str()`` and f-strings give the word too, on every Python version. Plain Python.
"""

from __future__ import annotations

from enum import Enum


class Vocabulary(str, Enum):
    """A word of one vocabulary: compares, prints and serialises as its plain value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class RunStatus(Vocabulary):
    """Where a run stands: run.json's ``state``, summary.json's ``status``, every screen's word.

    ``lost``: the launcher ended without writing a summary and nothing of the run is alive (the
    settler writes that summary); ``orphaned``: the launcher is gone but some rank still runs
    (``ddptui clean`` ends them); ``unreadable``: run.json or summary.json cannot be read.

    ``queued``: it waits in the machine's queue for its devices (``ddptui run --queue``); its
    waiter becomes its launcher when they are free.

    A run a scheduler places (``engine.core.backends``) also: ``pending`` (its scheduler has not
    started it yet, and says why), and the ends only the scheduler can tell: ``cancelled`` (by
    someone else; ``ddptui kill`` makes it ``killed``), ``timeout`` (its time limit),
    ``node-failure`` (a node of it failed).
    """

    QUEUED = "queued"
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"
    ORPHANED = "orphaned"
    UNREADABLE = "unreadable"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NODE_FAILURE = "node-failure"

    @property
    def final(self) -> bool:
        """Nothing of the run runs any more and its summary says how it ended."""
        return self in FINAL_STATUSES

    @property
    def active(self) -> bool:
        """Its launcher is (or is about to be) at work."""
        return self in (
            RunStatus.QUEUED,
            RunStatus.PENDING,
            RunStatus.STARTING,
            RunStatus.RUNNING,
        )

    @property
    def live(self) -> bool:
        """Some of its processes may still run: its launcher is (or is about to be) at work, or
        ranks it left behind run on (``orphaned``)."""
        return self.active or self == RunStatus.ORPHANED


FINAL_STATUSES = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.KILLED,
        RunStatus.LOST,
        RunStatus.CANCELLED,
        RunStatus.TIMEOUT,
        RunStatus.NODE_FAILURE,
    }
)


class RankStatus(Vocabulary):
    """One rank of a run, as the run observer judges it (``engine.core.runs.observer``)."""

    STARTING = "starting"  # no event from it yet
    RUNNING = "running"  # reporting
    STALLED = "stalled"  # silent for longer than the run allows
    STRAGGLER = "straggler"  # its step time is far above the others'
    FAILED = "failed"  # it reported an error, or it was the first to exit badly
    DONE = "done"  # it finished
    STOPPED = "stopped"  # ended by a signal after another rank failed or the run was killed

    @property
    def live(self) -> bool:
        """It should still be reporting, so its silence means something."""
        return self in (
            RankStatus.STARTING,
            RankStatus.RUNNING,
            RankStatus.STALLED,
            RankStatus.STRAGGLER,
        )


class RankActivity(Vocabulary):
    """What a rank was doing when its stack was taken (``engine.core.stacks.diagnosis``)."""

    STEPPING = "stepping"  # in its own code (or the user's): the stall is its own
    WAITING = "waiting on peers"  # inside a collective, or in backward waiting for the all-reduce
    STOPPED = "stopped by a signal"  # SIGSTOP: alive, but it runs nothing until SIGCONT
    FAILED = "failed"  # it reported an error and is on its way out
    CRASHED = "crashed"  # it exited badly without reporting an error
    FINISHED = "finished"  # it exited 0: its work is done, it is never the one others wait for
    GONE = "gone"  # no such process any more (how it ended is not known)
    UNKNOWN = "unknown"  # no stack could be taken
    # its process is not provably the run's (engine.core.procs.run_proof): never signalled or read
    NOT_PROVED = "not provably the run's"


class JobState(Vocabulary):
    """A training job (ours or foreign) found on the machine (``engine.core.jobs.process_table``)."""

    RUNNING = "running"
    ORPHANED = "orphaned"  # its launcher is gone
    STALLED = "stalled"  # a rank of it is stalled
    STOPPED = "stopped"  # a process of it is in the stopped state (SIGSTOP): SIGCONT resumes it
    ZOMBIE = "zombie"  # only unreaped entries are left


class JobKind(Vocabulary):
    """How a job was recognised."""

    DDPTUI = "ddptui"  # carries a ddptui run marker
    ELASTIC = "torchelastic"  # torchrun / torch.distributed.run workers
    SPAWN = "spawn"  # torch.multiprocessing.spawn children
    ENV = "env"  # a distributed environment, started some other way
    AGENT = "agent"  # a launcher with no workers yet


class ProcessRole(Vocabulary):
    """What one process is to its job."""

    LAUNCHER = "launcher"
    AGENT = "agent"
    RANK = "rank"
    WORKER = "worker"  # a rank's child (a DataLoader worker)
    CHILD = "child"


class ProcessState(Vocabulary):
    """What became of a process named by pid and start time (``engine.core.procs.process_identity
    .lookup``): the one answer every caller that looks a process up goes by."""

    RUNNING = "running"  # that very process exists and runs
    STOPPED = "stopped"  # it exists, stopped by a signal (SIGSTOP, Ctrl-Z): SIGCONT resumes it
    ZOMBIE = "zombie"  # it ended; only its entry is left until its parent collects it
    GONE = "gone"  # no process has its pid any more
    REUSED = "reused"  # its pid now names another process (a different start time)
    UNREADABLE = "unreadable"  # a process has its pid, but this user cannot tell which one

    @property
    def alive(self) -> bool:
        """It is that very process and it has not ended (it may be stopped)."""
        return self in (ProcessState.RUNNING, ProcessState.STOPPED)

    @property
    def ended(self) -> bool:
        """The process named is no more: gone, a zombie, or its pid reused."""
        return self in (ProcessState.ZOMBIE, ProcessState.GONE, ProcessState.REUSED)


class RowStatus(Vocabulary):
    """One row of a speedup table."""

    OK = "ok"
    FAILED = "failed"  # a run of it did not complete
    SKIPPED = "skipped"  # it never ran (this machine cannot, or the bench was interrupted)


class KillOutcome(Vocabulary):
    """What ``ddptui kill`` found."""

    STOPPED = "stopped"
    ALREADY_FINISHED = "already-finished"
    NOTHING_RUNNING = "nothing-running"


class HolderKind(Vocabulary):
    """What a process that uses a GPU is, as the GPUs screen and ``ddptui gpus`` say it."""

    DDPTUI = "ddptui"  # a rank (or launcher) of a ddptui run
    FOREIGN = "foreign"  # a rank of a torchrun / spawn / hand-launched job that is not ours
    ORPHANED = "orphaned"  # a process of a job whose launcher is gone
    WORKER = "dataloader-worker"  # a rank's child (a DataLoader worker)
    UNKNOWN = "unknown"  # not part of any training job found


class LeftoverKind(Vocabulary):
    """Files a dead training job leaves behind (``ddptui clean``)."""

    SHM_SEGMENT = "shm-segment"  # /dev/shm/torch_<pid>_...: shared tensors, host memory
    ELASTIC_DIR = "torchelastic-dir"  # /tmp/torchelastic_*: a torchrun agent's files


class StopRequester(Vocabulary):
    """Who asked a run's launcher to stop (``engine.core.runs.stop_request``): a stop the user
    asked for is said as such, never as a failure with a culprit."""

    KILL = "ddptui kill"
    CTRL_C = "Ctrl-C"
    UI = "the UI"

    @property
    def sentence(self) -> str:
        """How a run stopped this way says it: "stopped by ddptui kill"."""
        how = {StopRequester.KILL: "by", StopRequester.CTRL_C: "with", StopRequester.UI: "from"}
        return f"stopped {how[self]} {self.value}"
