"""Suites: sets of presets compared in one speedup table, read from TOML and validated where read.

A suite file (``presets/suites/<name>.toml``, or the user's ``<presets dir>/suites``)::

    description = "What the table compares"
    baseline = "single"                      # a row label; defaults to the first row

    [set]                                    # optional: overrides for every row
    "training.epochs" = 2

    [[rows]]
    label = "single"                         # optional; defaults to the preset name
    preset = "seed-single"

    [[rows]]
    label = "DDP x2"
    preset = "seed-ddp"
    set = { "devices.spec" = "2" }           # optional: overrides for this row

``set`` keys are ``section.key`` as for ``--set`` (nested tables such as ``{ devices = { spec =
"2" } }`` mean the same). Overrides apply in the order preset, suite ``set``, row ``set``, then
the bench command's own overrides. Plain Python. Every refusal is a ``ConfigError`` whose message
is one sentence naming the file and the key or row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.common.config_error import ConfigError
from engine.core.config.known_keys import check_known_keys
from engine.core.config.presets import bundled_presets_dir, load_preset, user_presets_dir
from engine.core.config.schema import RunConfig
from engine.core.config.toml_io import apply_overrides, read_toml_file

SUITE_KEYS = ("description", "baseline", "set", "rows")
ROW_KEYS = ("label", "preset", "set")


@dataclass(frozen=True)
class SuiteRow:
    label: str
    preset: str
    overrides: tuple[tuple[str, Any], ...] = ()  # ("section.key", value), in order


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path | None
    rows: tuple[SuiteRow, ...]
    baseline: str
    description: str = ""
    overrides: tuple[tuple[str, Any], ...] = ()  # for every row, before the row's own

    def __post_init__(self) -> None:
        where = self.where
        if not self.rows:
            raise ConfigError(
                "a suite needs at least one [[rows]] entry",
                where=where,
                key="rows",
                reason="no rows",
            )
        labels = [r.label for r in self.rows]
        for label in labels:
            if labels.count(label) > 1:
                raise ConfigError(
                    f"two rows are labelled {label!r}; give each row a distinct label",
                    where=where,
                    key="rows",
                    reason=f"two rows labelled {label!r}",
                )
        if self.baseline not in labels:
            raise ConfigError(
                f"baseline {self.baseline!r} is not a row label (rows: {', '.join(labels)})",
                where=where,
                key="baseline",
                reason=f"baseline {self.baseline!r} is not a row label",
            )

    @property
    def where(self) -> str:
        return str(self.path) if self.path else f"suite {self.name}"


@dataclass(frozen=True)
class SuiteFile:
    name: str
    path: Path
    bundled: bool
    description: str = field(default="", compare=False)


# ---- finding ------------------------------------------------------------------------------------


def bundled_suites_dir() -> Path:
    return bundled_presets_dir() / "suites"


def user_suites_dir() -> Path:
    return user_presets_dir() / "suites"


def list_suites() -> list[SuiteFile]:
    """Every suite by name; a user suite shadows a bundled one of the same name."""
    found: dict[str, SuiteFile] = {}
    for directory, bundled in ((bundled_suites_dir(), True), (user_suites_dir(), False)):
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found[path.stem] = SuiteFile(path.stem, path, bundled)
    return sorted(found.values(), key=lambda s: (not s.bundled, s.name))


def find_suite(name_or_path: str) -> SuiteFile:
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ConfigError("no such suite file", where=str(path))
        return SuiteFile(path.stem, path, False)
    for suite in list_suites():
        if suite.name == name_or_path:
            return suite
    names = ", ".join(s.name for s in list_suites()) or "none"
    raise ConfigError(
        f"no suite named {name_or_path!r}; known suites: {names}",
        reason=f"no suite named {name_or_path!r}",
    )


def load_suite(name_or_path: str) -> Suite:
    found = find_suite(name_or_path)
    return load_suite_file(found.path, name=found.name)


# ---- reading ------------------------------------------------------------------------------------


def load_suite_file(path: Path, *, name: str | None = None) -> Suite:
    data = read_toml_file(path, "suite")
    return suite_from_mapping(data, name=name or path.stem, path=path)


def suite_from_mapping(data: Mapping[str, Any], *, name: str, path: Path | None = None) -> Suite:
    where = str(path) if path else f"suite {name}"
    check_known_keys(data, SUITE_KEYS, where=where)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError("description must be a string", where=where, key="description")
    overrides = _overrides(where, "set", data.get("set", {}))
    raw_rows = data.get("rows")
    if raw_rows is None:
        raise ConfigError(
            "no rows; add a [[rows]] table with a preset for each row",
            where=where,
            key="rows",
            reason="no rows",
        )
    if not isinstance(raw_rows, list) or not all(isinstance(r, Mapping) for r in raw_rows):
        raise ConfigError(
            "rows must be an array of tables ([[rows]] entries)",
            where=where,
            key="rows",
            reason="rows is not an array of tables",
        )
    rows = tuple(_row(where, index, raw) for index, raw in enumerate(raw_rows, start=1))
    baseline = data.get("baseline", rows[0].label if rows else "")
    if not isinstance(baseline, str):
        raise ConfigError(
            "baseline must be a string naming a row label",
            where=where,
            key="baseline",
            reason="baseline is not a string",
        )
    return Suite(
        name=name,
        path=path,
        rows=rows,
        baseline=baseline,
        description=description,
        overrides=overrides,
    )


def _row(where: str, index: int, raw: Mapping[str, Any]) -> SuiteRow:
    check_known_keys(raw, ROW_KEYS, where=where, section="rows", entry=f"rows entry {index}")
    preset = raw.get("preset")
    if not isinstance(preset, str) or not preset:
        raise ConfigError(
            f'rows entry {index} needs preset = "<preset name>"',
            where=where,
            key="rows.preset",
            reason=f"rows entry {index} has no preset",
        )
    label = raw.get("label", preset)
    if not isinstance(label, str) or not label.strip():
        raise ConfigError(
            f"rows entry {index} has a label that is not a non-empty string",
            where=where,
            key="rows.label",
            reason=f"rows entry {index} has no usable label",
        )
    overrides = _overrides(where, f"rows entry {index} ({label}) set", raw.get("set", {}))
    return SuiteRow(label=label.strip(), preset=preset, overrides=overrides)


def _overrides(where: str, what: str, raw: Any) -> tuple[tuple[str, Any], ...]:
    """Flatten ``{"devices.spec": "2"}`` or ``{devices = {spec = "2"}}`` to dotted keys."""
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{what} must be a table of section.key = value",
            where=where,
            key="set",
            reason=f"{what} is not a table",
        )
    flat: list[tuple[str, Any]] = []

    def walk(prefix: str, table: Mapping[str, Any]) -> None:
        for key, value in table.items():
            dotted = f"{prefix}.{key}" if prefix else key
            if isinstance(value, Mapping):
                walk(dotted, value)
            else:
                flat.append((dotted, value))

    walk("", raw)
    for dotted, _ in flat:
        if dotted.count(".") != 1 and dotted not in ("faults", "description"):
            raise ConfigError(
                f"{what} key {dotted!r} is not section.key",
                where=where,
                key=dotted,
                reason=f"{dotted!r} is not section.key",
            )
    return tuple(flat)


# ---- making rows concrete --------------------------------------------------------------------------


def row_config(suite: Suite, row: SuiteRow, extra: Mapping[str, Any] | None = None) -> RunConfig:
    """The row's preset with the suite's, the row's and then ``extra`` overrides applied.

    A preset that cannot be found or an override that does not apply is a ConfigError naming the
    suite file and the row: bad input, found before anything runs.
    """
    try:
        config = load_preset(row.preset)
    except ConfigError as err:
        raise err.within(f"{suite.where}: row {row.label!r}") from None
    for source, overrides in (("set", suite.overrides), (f"row {row.label!r} set", row.overrides)):
        if overrides:
            try:
                config = apply_overrides(config, dict(overrides))
            except ConfigError as err:
                raise err.within(f"{suite.where}: {source}") from None
    if extra:
        config = apply_overrides(config, dict(extra))
    return config


def suite_of_presets(presets: list[str]) -> Suite:
    """An ad-hoc suite from preset names given on the command line; the first is the baseline.

    A preset named twice gets " #2" on its second label, so both rows stay in the table.
    """
    rows = []
    seen: dict[str, int] = {}
    for preset in presets:
        seen[preset] = seen.get(preset, 0) + 1
        label = preset if seen[preset] == 1 else f"{preset} #{seen[preset]}"
        rows.append(SuiteRow(label=label, preset=preset))
    if not rows:
        raise ConfigError("bench needs a --suite or at least one preset", reason="no presets")
    return Suite(name=" vs ".join(presets), path=None, rows=tuple(rows), baseline=rows[0].label)
