"""The two worlds stay apart, checked in a fresh interpreter (the only way to see what an import
really loads): the UI never loads torch, and the plain engine modules never load textual.

A leak here costs every ``ddptui`` start seconds of torch import, or drags the UI into the training
processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

UI_IMPORTS = [
    "import ddptui.app",
    "import ddptui.cli",
    "import ddptui.screens.launch, ddptui.screens.run, ddptui.screens.runs",
    "import ddptui.screens.processes, ddptui.screens.results",
    "import ddptui.watch, ddptui.messages, ddptui.actions",
]

PLAIN_ENGINE_MODULES = [
    "engine.config",
    "engine.devices",
    "engine.events",
    "engine.faults",
    "engine.gpus",
    "engine.plan",
    "engine.presets",
    "engine.rundir",
    "engine.summary",
    "engine.run_start",
    "engine.rank_states",
    "engine.process_table",
    "engine.process_kill",
    "engine.speedup_table",
    "engine.rank_bootstrap",
    "engine.memory_estimate",
    "engine.resource_guard",
]


def loaded_after(statement: str, watched: tuple[str, ...]) -> list[str]:
    code = f"{statement}\nimport sys\nprint(','.join(m for m in {watched!r} if m in sys.modules))\n"
    return [m for m in fresh_interpreter(code).split(",") if m]


def fresh_interpreter(code: str) -> str:
    """What ``code`` prints in a new interpreter started in the repository."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("statement", UI_IMPORTS)
def test_the_ui_never_imports_torch(statement: str) -> None:
    assert loaded_after(statement, ("torch", "torchvision", "numpy")) == []


def test_plain_engine_modules_never_import_textual() -> None:
    statement = "import " + ", ".join(PLAIN_ENGINE_MODULES)
    assert loaded_after(statement, ("textual", "ddptui", "torch")) == []


def test_the_rank_bootstrap_loads_only_the_standard_library() -> None:
    """It runs first in every rank, before torch: it must cost next to nothing."""
    code = (
        "import sys; before = set(sys.modules); import engine.rank_bootstrap; "
        "print(','.join(sorted(set(sys.modules) - before)))"
    )
    loaded = {m.split(".")[0] for m in fresh_interpreter(code).split(",") if m}
    assert loaded - set(sys.stdlib_module_names) == {"engine"}, loaded
