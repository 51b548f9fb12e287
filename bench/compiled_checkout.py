"""Byte-compile a checkout's packages before a bench times its commands.

An installed ddptui runs from compiled bytecode. Where Python may not write its caches
(``PYTHONDONTWRITEBYTECODE``, set on some machines, this one included) and nothing compiled a
checkout, every command compiles each module it imports from source again, and a timing measures
how much source there is rather than what the command does: ``ddptui kill`` spent some 100 ms of
its 260 ms starting up so here, and a checkout with more code looked slower by that alone.
"""

from __future__ import annotations

import compileall
from pathlib import Path

PACKAGES = ("engine", "ddptui")


def compile_checkout(checkout: Path) -> None:
    """Write the bytecode of ``checkout``'s packages (``__pycache__``, ignored by git)."""
    for package in PACKAGES:
        compileall.compile_dir(checkout / package, quiet=1)
