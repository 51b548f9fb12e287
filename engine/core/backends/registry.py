"""The backends there are, and which one a run has (``engine.core.backends``). Plain Python.

A backend is one object answering ``engine.core.backends.interface.Backend``; ``register`` adds
one (a third backend is its sub-package plus one ``register`` call where it is imported), and
``backend_of`` asks each registered backend, newest first, whether a run is its own; a run no
other backend owns is this machine's.
"""

from __future__ import annotations

from engine.core.backends.interface import Backend
from engine.core.backends.local.backend import LocalBackend
from engine.core.backends.slurm.backend import SlurmBackend
from engine.core.runs.run_info import RunInfo
from engine.core.runs.rundir import RunDir

__all__ = [
    "LOCAL",
    "SLURM",
    "Backend",
    "backend_called",
    "backend_for",
    "backend_named",
    "backend_of",
    "register",
    "unregister",
]

LOCAL = LocalBackend()
SLURM = SlurmBackend()
_REGISTERED: dict[str, Backend] = {LOCAL.name: LOCAL, SLURM.name: SLURM}


def register(backend: Backend) -> None:
    """Make ``backend`` one that ``backend_of`` and ``backend_called`` find; ValueError when
    another backend has its name."""
    known = _REGISTERED.get(backend.name)
    if known is not None and known is not backend:
        raise ValueError(f"a backend named {backend.name!r} is registered already")
    _REGISTERED[backend.name] = backend


def unregister(backend: Backend) -> None:
    """Forget ``backend`` (a test's own); the built-in ones stay."""
    if backend is not LOCAL and backend is not SLURM and _REGISTERED.get(backend.name) is backend:
        del _REGISTERED[backend.name]


def backend_called(name: str) -> Backend:
    """The registered backend of that name; ValueError naming the known ones when none is."""
    try:
        return _REGISTERED[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTERED))
        raise ValueError(f"no backend named {name!r} (known: {known})") from None


def backend_named(slurm: bool) -> Backend:
    return SLURM if slurm else LOCAL


def backend_of(run_dir: RunDir) -> Backend:
    """The backend of an existing run, from its run.json (RunDirError when it cannot be read)."""
    return backend_for(run_dir.read_run_info())


def backend_for(info: RunInfo | None) -> Backend:
    """The backend of the run of this run.json, as already read (None: none yet, this
    machine's)."""
    if info is None:
        return LOCAL
    for backend in reversed(_REGISTERED.values()):
        if backend is not LOCAL and backend.owns(info):
            return backend
    return LOCAL
