"""The backends there are, and which one a run has (``engine.core.backends``). Plain Python.

A backend is one object answering ``engine.core.backends.interface.Backend``: ``LOCAL`` (this
machine), and the ``BACKEND`` of each other sub-package's ``backend`` module, found here
without naming them and imported the first time a run placed elsewhere (or a backend by name,
or all of them) is asked for; ``register`` adds one more (a test's). ``backend_of`` asks each
registered backend, newest first, whether a run is its own; a run with no placement, or one no
other backend owns, is this machine's. Registering a backend also registers its ``watch`` with the run observer
(``engine.core.runs.placement``).
"""

from __future__ import annotations

import importlib

from engine.core.backends import backend_packages
from engine.core.backends.interface import Backend
from engine.core.backends.local.backend import LocalBackend
from engine.core.runs.placement import register_watch, unregister_watch
from engine.core.runs.run_info import RunInfo
from engine.core.runs.rundir import RunDir

__all__ = [
    "LOCAL",
    "Backend",
    "backend_called",
    "backend_for",
    "backend_of",
    "backends",
    "register",
    "unregister",
]

LOCAL = LocalBackend()
_REGISTERED: dict[str, Backend] = {LOCAL.name: LOCAL}
_built_in: tuple[Backend, ...] = ()  # LOCAL and each sub-package's BACKEND, once imported


def _with_built_in() -> dict[str, Backend]:
    """The registered backends, the built-in ones first: each backend sub-package's
    ``BACKEND`` (its ``backend`` module's) is imported the first time a backend other than this
    machine's is asked for, so a local run's ``ddptui kill`` or ``show`` never imports another
    backend's code (what the sub-packages register as they are imported is light)."""
    global _built_in
    if not _built_in:
        _built_in = (
            LOCAL,
            *(
                importlib.import_module(f"{__package__}.{name}.backend").BACKEND
                for name in backend_packages()
                if name != LOCAL.name
            ),
        )
        added = [b for b in _REGISTERED.values() if b is not LOCAL]
        _REGISTERED.clear()
        for backend in (*_built_in, *added):
            _add(backend)
    return _REGISTERED


def _add(backend: Backend) -> None:
    known = _REGISTERED.get(backend.name)
    if known is not None and known is not backend:
        raise ValueError(f"a backend named {backend.name!r} is registered already")
    if backend.watch is not None:
        register_watch(backend.watch)
    _REGISTERED[backend.name] = backend


def register(backend: Backend) -> None:
    """Make ``backend`` one that ``backend_of`` and ``backend_called`` find (after the
    built-in ones); ValueError when another backend has its name."""
    _with_built_in()
    _add(backend)


def unregister(backend: Backend) -> None:
    """Forget ``backend`` (a test's own) and its watch; the built-in ones stay."""
    if backend not in _built_in and _REGISTERED.get(backend.name) is backend:
        del _REGISTERED[backend.name]
        if backend.watch is not None:
            unregister_watch(backend.watch)


def backends() -> tuple[Backend, ...]:
    """Every registered backend, ``LOCAL`` first."""
    return tuple(_with_built_in().values())


def backend_called(name: str) -> Backend:
    """The registered backend of that name; ValueError naming the known ones when none is."""
    if name == LOCAL.name:
        return LOCAL
    try:
        return _with_built_in()[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTERED))
        raise ValueError(f"no backend named {name!r} (known: {known})") from None


def backend_of(run_dir: RunDir) -> Backend:
    """The backend of an existing run, from its run.json (RunDirError when it cannot be read)."""
    return backend_for(run_dir.read_run_info())


def backend_for(info: RunInfo | None) -> Backend:
    """The backend of the run of this run.json, as already read (None: none yet, this
    machine's)."""
    if info is None or LOCAL.owns(info):  # no placement: this machine's, nothing to import
        return LOCAL
    for backend in reversed(_with_built_in().values()):
        if backend is not LOCAL and backend.owns(info):
            return backend
    return LOCAL
