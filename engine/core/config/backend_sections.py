"""A backend's own section of a run config (``[NAME]`` in a preset or a run's config.toml): the
backend registers its section's type (``register_section``) as ``engine.core`` is first imported
(``engine.core.backends.import_backends``), and the config reads, checks, overrides and writes
that section as it does its own sections, without knowing which backend it is. Plain Python.
"""

from __future__ import annotations

_SECTIONS: dict[str, type] = {}


def register_section(name: str, section_type: type) -> None:
    """Make ``[name]`` a section of every run config, read into ``section_type`` (a frozen
    dataclass whose defaults mean "not asked"); ValueError when another type has that name."""
    known = _SECTIONS.get(name)
    if known is not None and known is not section_type:
        raise ValueError(f"a config section named [{name}] is registered already")
    _SECTIONS[name] = section_type


def unregister_section(name: str) -> None:
    """Forget ``[name]`` (a test's own section)."""
    _SECTIONS.pop(name, None)


def section_types() -> dict[str, type]:
    """Every registered backend section by name, in the order they were registered."""
    return dict(_SECTIONS)
