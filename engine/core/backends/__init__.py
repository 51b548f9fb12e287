"""Backends: where a run's ranks live. A backend starts, locates, signals and stops a run's
launchers; everything else (the run directory, the observer, stacks, the summary) is the same for
both, as torchelastic's ``PContext`` has one interface over its two ways of starting workers.

- ``interface``: the ``Backend`` protocol every backend answers.
- ``registry``: the backends there are (``LOCAL``, ``SLURM``); ``backend_of(run_dir)`` picks a
  run's backend from its run.json, ``backend_named`` the one a new run asks for.
- ``local``: this machine. ``start`` starts the launcher in its own session, which spawns the
  ranks; ``kill`` asks that launcher to stop them; ``snapshot`` takes stacks with py-spy or the
  faulthandler signal, here.
- ``slurm``: ``sbatch`` (or ``srun`` inside an allocation) starts one node launcher per node;
  Slurm owns the allocation; ddptui owns the watching, the stacks (the signal delivered through
  Slurm) and the proof that nothing of the run is left on any node.

Plain Python. This module imports nothing, so that a sub-package's module can be imported alone.
"""
