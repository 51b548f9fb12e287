"""A run config's TOML form, both ways: reading a preset (or a run's config.toml) into a
``RunConfig``, applying ``--set`` overrides, and writing it back (``to_toml``). Plain Python.

The dataclasses of ``engine.core.config.schema`` check values; this module checks the file's
shape: unknown sections and keys, and TOML values of the wrong type (an int is accepted for a
float, ``devices.spec = 2`` for "2"). Every refusal is a ``ConfigError`` whose sentence names
the file (or the override) and the key, with ``where``, ``key`` and ``reason`` set.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_origin, get_type_hints

from engine.core.common.config_error import ConfigError
from engine.core.config.backend_sections import section_types
from engine.core.config.known_keys import check_known_keys
from engine.core.config.schema import RunConfig, check_finite

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SECTION_TYPES: dict[str, type] = {
    name: hint
    for name, hint in get_type_hints(RunConfig).items()
    if name not in ("name", "description", "faults", "backend_sections")
}
TOP_LEVEL_KEYS = ("description", "faults")
_TYPE_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


# ---- reading ------------------------------------------------------------------------------------


def _coerce(where: str, key: str, value: Any, expected: Any) -> Any:
    """Check one TOML value of the dotted ``key`` against its field type; ints are accepted for
    floats."""
    origin = get_origin(expected)
    if origin is dict:
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return dict(value)
        raise ConfigError(
            f"{key} is {value!r}; expected a table like {{ width = 32 }}",
            where=where,
            key=key,
            reason=f"{key} is not a table",
        )
    if origin is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(
            f"{key} is {value!r}; expected a list of strings",
            where=where,
            key=key,
            reason=f"{key} is not a list of strings",
        )
    plain_int = isinstance(value, int) and not isinstance(value, bool)
    if expected is bool and isinstance(value, bool):
        return value
    if expected is int and plain_int:
        return value
    if expected is float and (plain_int or isinstance(value, float)):
        try:
            check_finite(key, float(value))
        except ConfigError as err:
            raise err.within(where) from None
        return float(value)
    if expected is str:
        if isinstance(value, str):
            return value
        if key in ("devices.spec", "training.checkpoint_every") and plain_int:
            return str(value)  # devices.spec = 2 means two devices; checkpoint_every = 500 steps
    wanted = _TYPE_NAMES.get(expected, str(expected))
    raise ConfigError(
        f"{key} is {value!r} ({type(value).__name__}); expected {wanted}",
        where=where,
        key=key,
        reason=f"{key} is not {wanted}",
    )


def _build_section(where: str, section: str, cls: type, values: Mapping[str, Any]) -> Any:
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        check_known_keys([key], hints, where=where, section=section)
        kwargs[key] = _coerce(where, f"{section}.{key}", value, hints[key])
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.within(where) from None


def all_section_types() -> dict[str, type]:
    """The config's own sections, then every backend's (``engine.core.config.backend_sections``),
    which are read, checked and overridden the same way."""
    return {**SECTION_TYPES, **section_types()}


def config_from_mapping(data: Mapping[str, Any], *, name: str, where: str) -> RunConfig:
    """Build a RunConfig from parsed TOML. ``where`` names the file in every error."""
    sections: dict[str, Any] = {}
    backend_sections: dict[str, Any] = {}
    types = all_section_types()
    for key, value in data.items():
        if key in types:
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"[{key}] must be a table of keys",
                    where=where,
                    key=key,
                    reason=f"[{key}] is not a table",
                )
            built = _build_section(where, key, types[key], value)
            (sections if key in SECTION_TYPES else backend_sections)[key] = built
        else:
            known = [*TOP_LEVEL_KEYS, *types]
            check_known_keys([key], known, where=where, what="section or key")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError("description must be a string", where=where, key="description")
    faults = data.get("faults", [])
    if not isinstance(faults, list) or not all(isinstance(f, str) for f in faults):
        raise ConfigError(
            "faults must be a list of strings like 'crash:1:3'",
            where=where,
            key="faults",
            reason="faults is not a list of strings",
        )
    try:
        return RunConfig(
            name=name,
            description=description,
            faults=tuple(faults),
            backend_sections=backend_sections,
            **sections,
        )
    except ConfigError as err:
        raise err.within(where) from None


TOML_MAX_BYTES = 1 << 20  # a preset or a config.toml is a few kB: more is no preset


def read_toml_file(path: Path, what: str) -> dict[str, Any]:
    """Parse one TOML file; a missing, unreadable, oversized or malformed file is a ConfigError
    naming it."""
    where = str(path)
    try:
        if path.stat().st_size > TOML_MAX_BYTES:
            raise ConfigError(
                f"{path.stat().st_size} bytes, over the {TOML_MAX_BYTES} a {what} file may hold",
                where=where,
                reason="too large",
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such {what} file", where=where) from None
    except OSError as err:
        raise ConfigError(
            f"cannot be read ({err.strerror})", where=where, reason="cannot be read"
        ) from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
            "TOML files are UTF-8",
            where=where,
            reason="not UTF-8 text",
        ) from None
    return _parse_toml(text, where)


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"not valid TOML ({err})", where=where, reason="not valid TOML") from None


def load_config(path: Path, *, name: str | None = None) -> RunConfig:
    """Read and validate one preset file (or a run directory's config.toml)."""
    data = read_toml_file(path, "preset")
    preset_name = name or str(data.pop("name", path.stem))
    data.pop("name", None)
    return config_from_mapping(data, name=preset_name, where=str(path))


def config_from_text(text: str, *, where: str, name: str | None) -> RunConfig:
    """Validate a config already read (a run directory's config.toml, read as run files are)."""
    data = _parse_toml(text, where)
    preset_name = name or str(data.pop("name", Path(where).stem))
    data.pop("name", None)
    return config_from_mapping(data, name=preset_name, where=where)


# ---- overrides ----------------------------------------------------------------------------------


def parse_setting(item: str) -> tuple[str, str]:
    """One ``SECTION.KEY=VALUE`` as given to ``--set`` (or the launch form's set field)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{item!r} is not SECTION.KEY=VALUE", reason="not SECTION.KEY=VALUE")
    return key.strip(), value.strip()


def _parse_override_value(raw: str) -> Any:
    """``--set`` values are TOML literals; a bare word that is not one is a string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_overrides(config: RunConfig, overrides: Mapping[str, Any]) -> RunConfig:
    """Return a copy with ``section.key`` overrides applied and re-validated.

    Values may be strings from the command line (parsed as TOML literals) or typed values.
    """
    data = to_mapping(config)
    types = all_section_types()
    for dotted, raw in overrides.items():
        where = f"override {dotted}={raw}"
        section, _, key = dotted.partition(".")
        value = _parse_override_value(raw) if isinstance(raw, str) else raw
        if section in TOP_LEVEL_KEYS and not key:
            data[section] = value
            continue
        if section not in types or not key:
            raise ConfigError(
                f"expected section.key with a section among {', '.join(types)}",
                where=where,
                key=dotted,
                reason=f"{dotted} is not section.key",
            )
        hints = get_type_hints(types[section])
        check_known_keys([key], hints, where=where, section=section)
        if hints[key] is str and not isinstance(value, str):
            value = str(value) if not isinstance(value, bool) else value
        data[section][key] = value
    name = data.pop("name")
    return config_from_mapping(data, name=name, where="overrides")


# ---- writing ------------------------------------------------------------------------------------


def to_mapping(config: RunConfig) -> dict[str, Any]:
    """Plain nested dict (TOML-ready) of a config: its sections, every backend's among them (at
    its defaults when the config has none), then its faults."""
    data = dataclasses.asdict(config)
    given = data.pop("backend_sections")
    del data["faults"]
    for section, section_type in section_types().items():
        data[section] = given.get(section) or dataclasses.asdict(section_type())
    data["faults"] = list(config.faults)
    return data


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        pairs = ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + pairs + " }" if pairs else "{}"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(config: RunConfig) -> str:
    """The resolved config as TOML; ``load_config`` reads it back to an equal RunConfig."""
    data = to_mapping(config)
    lines = [f"name = {_toml_value(data.pop('name'))}"]
    for key in TOP_LEVEL_KEYS:
        lines.append(f"{key} = {_toml_value(data.pop(key))}")
    backend_types = section_types()
    for section, values in data.items():
        # a backend's section only where it asks something: every other config.toml stays as it was
        if section in backend_types and section not in config.backend_sections:
            continue
        lines.append(f"\n[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"
