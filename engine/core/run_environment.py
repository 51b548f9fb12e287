"""The environment every process of a run inherits from its launcher: the names, in one place.

Standard library only (nothing at all, in fact): the rank bootstrap reads these before torch is
imported, and the process scan reads them from other processes' environments.
"""

from __future__ import annotations

# The run marker: a process is ours only if it carries this (and matches a recorded pid + start).
RUN_MARKER_ENV = "DDPTUI_RUN_ID"
RUN_DIR_ENV = "DDPTUI_RUN_DIR"  # absolute path of the run directory
LAUNCHER_PID_ENV = "DDPTUI_LAUNCHER_PID"  # the launcher that started the ranks
THREADS_ENV = "DDPTUI_THREADS_PER_RANK"  # CPU threads each rank may use (cores / ranks)
# Where the ranks meet (the c10d store): file:///RUN_DIR/.rendezvous for a single-node run, so
# nothing listens on a TCP port; tcp://MASTER_ADDR:PORT across nodes, served on that address only.
RENDEZVOUS_ENV = "DDPTUI_RENDEZVOUS"
