"""Text from a run directory, a process's command line or a log, made safe to show on a terminal.

Anything a run's owner writes (a run directory's name, summary.json's fields, a rank's log, a
process's arguments) can hold escape sequences that set a terminal's title, clear it, move its
cursor or colour what follows, and root's ``ddptui runs`` / the UI would send them to root's
terminal. ``visible`` is the one place that makes them harmless, for the CLI and the UI alike:
call it on every such string just before it is shown. Plain Python.
"""

from __future__ import annotations

import unicodedata

# Kept as they are: they only lay text out (a traceback's lines, a stack's indentation).
_LAYOUT = frozenset("\n\t")


def _shown(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _hidden(char: str) -> bool:
    """A character that acts on the terminal (or reorders what follows) instead of showing:
    C0 and C1 controls, DEL, and the invisible format characters (bidirectional overrides,
    zero-width ones) that make a line read other than it is."""
    if char in _LAYOUT:
        return False
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp")


def visible(text: str, *, one_line: bool = False) -> str:
    """``text`` with every control character written out as its escape (``\\x1b``, ``\\r``,
    ``\\u202e``), so it shows as text and does nothing to the terminal. Newlines and tabs stay,
    unless ``one_line`` (a table cell, a title), where they are written out too. Idempotent: what
    it returns holds no control character, so showing it twice changes nothing."""
    if text.isprintable() and not one_line:  # the common case, fast
        return text
    out = []
    for char in text:
        if _hidden(char) or (one_line and char in _LAYOUT):
            out.append(_shown(char))
        else:
            out.append(char)
    shown = "".join(out)
    return text if shown == text else shown  # the very string when nothing changed
