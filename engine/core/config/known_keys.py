"""The one check that a TOML table holds only the keys it may (a preset's sections, a suite and
its rows, an override), and the one sentence that names the key it may not."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from engine.core.common.config_error import ConfigError


def check_known_keys(
    keys: Iterable[str],
    known: Collection[str],
    *,
    where: str,
    section: str = "",
    entry: str = "",
    what: str = "key",
) -> None:
    """Raise a ConfigError naming ``where`` and the first of ``keys`` not in ``known``.

    A key of a ``section`` is named by its dotted path (``training.epochs``); a top-level key, or
    one of an array's ``entry`` (``rows entry 2``), by its quoted name. ``what`` is what the
    table holds where it is not only keys (a file's top level: "section or key").
    """
    for key in keys:
        if key in known:
            continue
        dotted = f"{section}.{key}" if section else key
        named = dotted if section else repr(key)
        if entry:
            named = f"{key!r} in {entry}"
        listed = "known keys" if what == "key" else "known"
        raise ConfigError(
            f"unknown {what} {named} ({listed}: {', '.join(known)})",
            where=where,
            key=dotted,
            reason=f"unknown {what} {named}",
        )
