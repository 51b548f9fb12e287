"""Where presets and suites live, and how a name becomes a config.

Search order for a name: a path to a ``.toml`` file; the user's presets directory
(``$DDPTUI_PRESETS`` or ``~/.config/ddptui/presets``); the bundled presets (``presets/`` in a source
checkout, ``engine/bundled_presets`` in an installed wheel). Plain Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from engine.core.config.schema import ConfigError, RunConfig
from engine.core.config.toml_io import load_config

# engine/ (this file is engine/core/config/presets.py); the wheel carries the presets in
# engine/bundled_presets.
_PACKAGE_DIR = Path(__file__).resolve().parents[2]


def bundled_presets_dir() -> Path:
    source_checkout = _PACKAGE_DIR.parent / "presets"
    if source_checkout.is_dir():
        return source_checkout
    return _PACKAGE_DIR / "bundled_presets"


def user_presets_dir() -> Path:
    env = os.environ.get("DDPTUI_PRESETS")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "ddptui" / "presets"


@dataclass(frozen=True)
class PresetFile:
    name: str
    path: Path
    bundled: bool


def list_presets() -> list[PresetFile]:
    """Every preset by name; a user preset shadows a bundled one of the same name."""
    found: dict[str, PresetFile] = {}
    for directory, bundled in ((bundled_presets_dir(), True), (user_presets_dir(), False)):
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found[path.stem] = PresetFile(path.stem, path, bundled)
    return sorted(found.values(), key=lambda p: (not p.bundled, p.name))


def find_preset(name_or_path: str) -> PresetFile:
    suffix = Path(name_or_path).suffix
    if suffix and suffix != ".toml" and (os.sep in name_or_path or Path(name_or_path).is_file()):
        what = "a shell script" if suffix == ".sh" else f"a {suffix} file"
        raise ConfigError(
            f"{what}, not a preset (.toml) nor a Python script (.py, or -m package.module); "
            "give ddptui the preset, or the Python script it should run",
            where=name_or_path,
            reason=f"{what}, not a preset or a Python script",
        )
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ConfigError("no such preset file", where=str(path))
        return PresetFile(path.stem, path, False)
    for preset in list_presets():
        if preset.name == name_or_path:
            return preset
    names = ", ".join(p.name for p in list_presets())
    raise ConfigError(
        f"no preset named {name_or_path!r}; known presets: {names}",
        reason=f"no preset named {name_or_path!r}",
    )


def load_preset(name_or_path: str) -> RunConfig:
    """The config of the preset named (or at the path) given."""
    return load_preset_file(find_preset(name_or_path))


def load_preset_file(preset: PresetFile) -> RunConfig:
    """A preset's config. A script it names by a relative path is the one beside the preset file,
    wherever ddptui is started from."""
    config = load_config(preset.path, name=preset.name)
    script = Path(config.script.path).expanduser() if config.script.path else None
    if script is not None and not script.is_absolute():
        beside = (preset.path.parent / script).resolve()
        config = replace(config, script=replace(config.script, path=str(beside)))
    return config
