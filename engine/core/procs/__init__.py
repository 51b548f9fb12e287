"""Processes, judged one at a time: one lookup by pid + start time + run marker
(``process_identity``), who holds a GPU device file (``device_holders``), the files dead jobs leave
(``leftovers``) and the one way anything is stopped (``stopping``: SIGTERM, grace, SIGKILL, check).
Knows nothing of run directories beyond the marker a process carries.
"""
