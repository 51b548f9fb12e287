"""The Slurm backend: a run's ranks on Slurm's nodes, one node launcher per node.

- ``config``: the ``[slurm]`` section of a run's config (partition, nodes, time, …).
- ``cluster``: running Slurm's programs (squeue, sacct, sinfo, scancel) and reading the cluster.
- ``jobs``: Slurm's word on one job, cached briefly (``QUEUE``, ``read_job``).
- ``submit``: writing the batch script and submitting it (or ``srun`` inside an allocation).
- ``state``: what a run on Slurm is, from its job and its node launchers' records.
- ``stacks``: the ranks' stacks, the signal delivered through Slurm.
- ``stop``: cancelling the job and the proof that nothing of the run is left on any node.
- ``backend``: the ``SlurmBackend`` over them.
"""
