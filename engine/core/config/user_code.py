"""Where the user's own code is: a model or data factory (``package.module:callable``), a training
script (a path) or a module (``python -m`` style). Plain Python, and finding only: nothing of the
user's is imported or run here (the UI never runs user code; the ranks do).

A module is looked for the way the ranks will import it: on the current directory (the launcher
runs with it on its path, as ``python -m`` does) and then ``sys.path``, one package level at a
time through the import machinery's path finder, which reads directories without executing any
``__init__``.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder
from pathlib import Path

from engine.core.common.config_error import ConfigError
from engine.core.config.schema import RunConfig


def split_factory(value: str) -> tuple[str, str]:
    """("package.module", "callable") of "package.module:callable"."""
    module, _, attribute = value.partition(":")
    return module, attribute


def search_path() -> list[str]:
    """Where a rank looks for the user's modules: the launcher's working directory, then the
    interpreter's path (``PYTHONPATH`` included)."""
    return [os.getcwd(), *(p for p in sys.path if p)]


def module_location(name: str, path: list[str] | None = None) -> str | None:
    """The file (or package directory) that ``import name`` would load, found without running any
    of it; None when there is none."""
    locations: list[str] | None = path if path is not None else search_path()
    origin: str | None = None
    for part in name.split("."):
        spec = PathFinder.find_spec(part, locations)
        if spec is None:
            return None
        origin = spec.origin if spec.origin not in (None, "namespace") else None
        locations = list(spec.submodule_search_locations or [])
        if origin is None and locations:
            origin = locations[0]
    return origin


def check_factory(key: str, value: str) -> None:
    """ConfigError naming ``key`` and ``value`` when its module cannot be found."""
    if not value:
        return
    module, _ = split_factory(value)
    if module_location(module) is None:
        raise ConfigError(
            f"{key} = {value!r}: no module {module!r} on the Python path of the run (the current "
            "directory, then PYTHONPATH and the installed packages)",
            key=key,
            reason=f"no module {module!r}",
        )


def check_script_exists(config: RunConfig) -> None:
    """ConfigError when the script file (a ``.py``) or module the config names cannot be found;
    nothing of it is read or run."""
    script = config.script
    if script.path:
        path = Path(script.path).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"script.path = {script.path!r}: no such file",
                key="script.path",
                reason=f"no such file {script.path!r}",
            )
        if path.suffix != ".py":
            raise ConfigError(
                f"script.path = {script.path!r}: expected a Python file (.py)",
                key="script.path",
                reason="script.path is not a .py file",
            )
    if script.module and module_location(script.module) is None:
        raise ConfigError(
            f"script.module = {script.module!r}: no such module on the Python path of the run",
            key="script.module",
            reason=f"no module {script.module!r}",
        )


def check_user_code(config: RunConfig) -> None:
    """Every piece of the user's code ``config`` names can be found (nothing is imported)."""
    check_factory("model.factory", config.model.factory)
    check_factory("data.factory", config.data.factory)
    check_script_exists(config)
