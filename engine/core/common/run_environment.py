"""What every process of a run shares with the tools that watch it: the names of the environment
it inherits from its launcher, and how a rank is asked for its stack.

Standard library only: the rank bootstrap reads these before torch is imported, the process scan
reads the environment of other processes, the stack snapshots send the signal.
"""

from __future__ import annotations

import signal

# The run marker: a process is ours only if it carries this (and matches a recorded pid + start).
RUN_MARKER_ENV = "DDPTUI_RUN_ID"
RUN_DIR_ENV = "DDPTUI_RUN_DIR"  # absolute path of the run directory
LAUNCHER_PID_ENV = "DDPTUI_LAUNCHER_PID"  # the launcher that started the ranks
THREADS_ENV = "DDPTUI_THREADS_PER_RANK"  # CPU threads each rank may use (cores / ranks)
# The node a rank of a run across nodes runs on (its scheduler's name for it), set by its node
# launcher.
NODE_ENV = "DDPTUI_NODE"

# A rank writes every thread's Python stack (faulthandler) when it receives this signal, even while
# it is blocked in a collective or holds the GIL. Not SIGUSR1: Lightning uses it to requeue a job
# on a scheduler's nodes.
STACK_DUMP_SIGNAL = signal.SIGUSR2
STACKS_DIR = "stacks"  # in the run directory: faulthandler files and snapshots


def faulthandler_file_name(pid: int, node: str = "") -> str:
    """The file (in the run directory's stacks folder) a rank's stack dumps are appended to; on a
    run across nodes the node is in the name (two nodes may have a process of the same pid)."""
    return f"pid-{pid}@{node}.txt" if node else f"pid-{pid}.txt"


# Where the ranks meet (the c10d store): file:///RUN_DIR/.rendezvous for a single-node run, so
# nothing listens on a TCP port; tcp://MASTER_ADDR:PORT across nodes, served on that address only.
RENDEZVOUS_ENV = "DDPTUI_RENDEZVOUS"

# A later attempt of a run (``ddptui resume``, a restart after a failure) in the same run
# directory: the attempt's number (1 for the first; torchrun's TORCHELASTIC_RESTART_COUNT is one
# less) and the checkpoint the engine's ranks go on from, when there is one.
ATTEMPT_ENV = "DDPTUI_ATTEMPT"
RESUME_FROM_ENV = "DDPTUI_RESUME_FROM"
# torchrun's name for the restarts before this attempt (0 in the first), which scripts read.
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
# Where a script's own checkpoints go (RUN_DIR/checkpoints): the newest file there is what a
# restarted attempt is pointed at through its ``script.resume_arg``.
CHECKPOINT_DIR_ENV = "DDPTUI_CHECKPOINT_DIR"
