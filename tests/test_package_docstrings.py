"""Every package says what it holds: each module and sub-package of ``engine.core`` (at every
depth) and of ``ddptui`` is named in its package's ``__init__`` docstring, so a reader finds a
module from its package and a new module is placed, not dropped in."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.fixtures.repo import REPO_ROOT

PACKAGE_ROOTS = (REPO_ROOT / "engine" / "core", REPO_ROOT / "ddptui")
# engine.core.backends names its sub-packages by a rule, not one by one: each is one backend,
# found at run time (``backend_packages``), so that nothing outside a backend's own package names
# it (issue 28). Its docstring states the rule; each backend's own docstring names its modules.
BY_RULE = {REPO_ROOT / "engine" / "core" / "backends": "every other sub-package is one backend"}


def _packages() -> list[Path]:
    return sorted(init.parent for root in PACKAGE_ROOTS for init in root.rglob("__init__.py"))


def _members(package: Path) -> list[str]:
    modules = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    subpackages = [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    return sorted(modules + subpackages)


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_a_packages_docstring_names_every_module_in_it(package: Path) -> None:
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    members = _members(package)
    if package in BY_RULE:
        assert BY_RULE[package] in " ".join(docstring.split())
        members = [m for m in members if not (package / m / "__init__.py").is_file()]
    missing = [m for m in members if not re.search(rf"\b{re.escape(m)}\b", docstring)]
    assert not missing, f"{package.relative_to(REPO_ROOT)}/__init__.py does not name {missing}"


def test_the_walk_finds_the_packages_and_their_modules() -> None:
    names = {str(p.relative_to(REPO_ROOT)) for p in _packages()}
    assert {"engine/core/runs", "engine/core/common", "ddptui/widgets"} <= names
    assert "run_layout" in _members(REPO_ROOT / "engine" / "core" / "common")
    backends = REPO_ROOT / "engine" / "core" / "backends"
    assert {"local", "slurm", "registry"} <= set(_members(backends))
