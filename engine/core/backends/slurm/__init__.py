"""The Slurm backend: a run's ranks on Slurm's nodes, one node launcher per node.

- ``config``: the ``[slurm]`` section of a run's config (partition, nodes, time, …).
- ``records``: run.json's placement of a run on Slurm (its job), each node launcher's record and
  proof, and the paths of the backend's own files.
- ``cluster``: running Slurm's programs (squeue, sacct, sinfo, scancel) and reading the cluster.
- ``jobs``: Slurm's word on one job, cached briefly (``QUEUE``, ``read_job``).
- ``submit``: writing the batch script and submitting it (or ``srun`` inside an allocation).
- ``node_loss``: which node of a job Slurm ended NODE_FAIL (or requeued) was lost.
- ``state``: what a run on Slurm is, from its job and its node launchers' records.
- ``watch``: what the run observer asks of a run on Slurm, answered by ``state``.
- ``restarts``: a run going on as its next attempt after a failure or a lost node (Slurm's
  requeue), as ``supervision.max_restarts`` allows.
- ``job_steps``: the batch job's own steps around its node launchers (``begin``, ``finish``).
- ``node_proof``: what a node launcher proves at its end: nothing of its attempt left on its node.
- ``options``: ``ddptui run``'s options for Slurm and the help lines that teach them.
- ``stacks``: the ranks' stacks, the signal delivered through Slurm.
- ``stop``: cancelling the job and the proof that nothing of the run is left on any node.
- ``backend``: the ``SlurmBackend`` over them.

Importing this package (``engine.core`` does, as it starts) registers what the layers below the
backends know of Slurm: its config section and what the run observer asks of its runs. Both
modules are light; the rest is imported when a run on Slurm is met.
"""

from engine.core.backends.slurm.config import SECTION, SlurmConfig
from engine.core.backends.slurm.watch import SLURM_WATCH
from engine.core.config.backend_sections import register_section
from engine.core.runs.placement import register_watch

register_section(SECTION, SlurmConfig)
register_watch(SLURM_WATCH)
