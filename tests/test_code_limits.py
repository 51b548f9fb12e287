"""The founders' size limits, checked: no module of ``engine`` or ``ddptui`` over 500 lines and no
function or method over 80, from its ``def`` to its last line (a command's decorators declare
its options: they are not its body). Whether a module over 450 lines does two jobs is a
judgement no walk makes: the modules over 450 are listed here with the one job each does, so a
new one fails until someone has judged it (and split it when it does two)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.fixtures.repo import REPO_ROOT

MODULE_LIMIT = 500
FUNCTION_LIMIT = 80
JUDGED_FROM = 450
PACKAGES = ("engine", "ddptui")

# Over 450 lines, and one job each (see docs/architecture.md for what each holds).
ONE_JOB = {
    "engine/core/runs/events.py": "the event protocol: its typed events, their line and its files",
    "engine/core/runs/rank_states.py": "folding events into each rank's state (stall, straggler)",
    "engine/train/step_timing.py": "the step timer's hooks and where a rank installs them",
    "engine/train/supervisor.py": "the launcher's watch over its ranks to their end",
    "ddptui/screens/launch.py": "the Launch screen",
    "ddptui/screens/run.py": "the Run screen",
}


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO_ROOT / package).rglob("*.py"))


def lines_of(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def long_functions(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """``module:line name (N lines)`` for each function or method over the limit."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LIMIT:
                where = path.relative_to(root)
                found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_module_is_over_500_lines() -> None:
    over = [
        f"{p.relative_to(REPO_ROOT)} ({n} lines)"
        for p in modules()
        if (n := lines_of(p)) > MODULE_LIMIT
    ]
    assert over == [], f"split these by job: {over}"


def test_no_function_is_over_80_lines() -> None:
    over = [f for p in modules() for f in long_functions(p)]
    assert over == [], f"these functions do more than one thing: {over}"


def test_every_module_over_450_lines_was_judged_to_do_one_job() -> None:
    big = {str(p.relative_to(REPO_ROOT)) for p in modules() if lines_of(p) > JUDGED_FROM}
    unjudged = sorted(big - ONE_JOB.keys())
    assert unjudged == [], (
        f"over {JUDGED_FROM} lines: {unjudged}; split a module that does two jobs, or add it to "
        "ONE_JOB with the one job it does"
    )


def test_the_walk_sees_the_packages_and_would_name_a_long_function(tmp_path: Path) -> None:
    assert len(modules()) > 150
    assert REPO_ROOT / "engine/train/launch.py" in modules()
    long = tmp_path / "long.py"
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LIMIT - 1))
    long.write_text(
        f"class C:\n    @staticmethod\n    def just_fits() -> None:\n{body}\n\n"
        f"    @staticmethod\n    def too_long() -> None:\n{body}\n        x = 0\n"
    )
    assert long_functions(long, tmp_path) == [f"long.py:85 too_long ({FUNCTION_LIMIT + 1} lines)"]
