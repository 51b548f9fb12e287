"""The two worlds stay apart, checked in a fresh interpreter (the only way to see what an import
really loads): the UI never loads torch, and the plain engine modules never load textual.

A leak here costs every ``ddptui`` start seconds of torch import, or drags the UI into the training
processes."""

from __future__ import annotations

import subprocess
import sys

from tests.fixtures.repo import REPO_ROOT


def every_module(package: str) -> list[str]:
    """Every module of ``package``, found on disk: a new module is checked without a list to keep."""
    base = REPO_ROOT / package.replace(".", "/")
    return sorted(
        ".".join((package, *path.relative_to(base).with_suffix("").parts)).removesuffix(".__init__")
        for path in base.rglob("*.py")
        if path.name != "__main__.py"
    )


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


def test_the_walk_finds_the_modules_it_must_check() -> None:
    assert {"ddptui.app", "ddptui.cli", "ddptui.screens.run"} <= set(every_module("ddptui"))
    assert {"engine.core.config.schema", "engine.core.runs.rundir"} <= set(
        every_module("engine.core")
    )


def test_no_ui_module_imports_torch() -> None:
    statement = "import " + ", ".join(every_module("ddptui"))
    assert loaded_after(statement, ("torch", "torchvision", "numpy", "engine.train")) == []


def test_no_core_engine_module_imports_textual_or_torch() -> None:
    statement = "import " + ", ".join(every_module("engine.core"))
    assert loaded_after(statement, ("textual", "ddptui", "torch", "engine.train")) == []


def test_the_rank_bootstrap_loads_only_the_standard_library() -> None:
    """It runs first in every rank, before torch: it must cost next to nothing."""
    code = (
        "import sys; before = set(sys.modules); import engine.train.rank_bootstrap; "
        "print(','.join(sorted(set(sys.modules) - before)))"
    )
    loaded = {m.split(".")[0] for m in fresh_interpreter(code).split(",") if m}
    assert loaded - set(sys.stdlib_module_names) == {"engine"}, loaded


def test_the_report_call_a_training_script_imports_stays_light() -> None:
    """``from ddptui.report import report`` runs inside the user's ranks: no textual, no torch."""
    statement = "from ddptui.report import report"
    assert loaded_after(statement, ("textual", "torch", "click", "engine.train")) == []
