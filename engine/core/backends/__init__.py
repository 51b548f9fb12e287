"""Backends: where a run's ranks live. A backend starts, locates, observes, signals and stops a
run's launchers; everything else (the run directory, the observer, stacks, the summary) is the
same for every backend, as torchelastic's ``PContext`` has one interface over its two ways of
starting workers.

- ``interface``: the ``Backend`` protocol every backend answers, and what a backend declares of
  ``ddptui run``'s options (``RunOptions``).
- ``registry``: the backends there are (``LOCAL``, and each sub-package's ``BACKEND``);
  ``backend_of(run_dir)`` picks a run's backend from its run.json, ``backend_called`` the one a
  new run asks for.
- ``local``: this machine. ``start`` starts the launcher in its own session, which spawns the
  ranks; ``kill`` asks that launcher to stop them; ``snapshot`` takes stacks with py-spy or the
  faulthandler signal, here.
- every other sub-package is one backend that places runs elsewhere (a scheduler's nodes): it
  owns everything of that place, and its ``__init__`` registers what the layers below need to
  know of its runs (its config section, ``engine.core.config.backend_sections``; what the run
  observer asks of them, ``engine.core.runs.placement``).

Plain Python. ``import_backends`` imports every sub-package, so that each registers itself;
``engine.core`` calls it as it is first imported, so every process that reads a run (a
launcher, a rank, the CLI, the UI) knows every backend's runs. A third backend is one new
sub-package: nothing outside it names it.
"""

from __future__ import annotations

import importlib
import pkgutil


def backend_packages() -> list[str]:
    """The name of every backend's sub-package, ``local`` among them, in name order."""
    return sorted(found.name for found in pkgutil.iter_modules(__path__) if found.ispkg)


def import_backends() -> None:
    """Import every backend's sub-package: each registers itself with the layers below."""
    for name in backend_packages():
        importlib.import_module(f"{__name__}.{name}")
