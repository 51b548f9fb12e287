"""Processes, judged one at a time: the /proc scan, each process as one ``ProcessInfo``
(``process_scan``), one lookup by pid + start time + run marker (``process_identity``), the proof
that a process is a run's (``run_proof``: its own environment carries the run's marker), who holds
a GPU device file (``device_holders``), what of a run outlives its ranks (``run_leftovers``), the
files dead jobs leave (``leftovers``) and the one way anything is stopped (``stopping``: SIGTERM,
grace, SIGKILL, check).
Knows nothing of run directories beyond the marker a process carries.
"""
