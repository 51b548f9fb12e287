"""JSON that any strict parser reads: no bare ``NaN`` or ``Infinity``.

Python's ``json`` writes a non-finite float as ``NaN`` / ``Infinity``, which is not JSON: ``jq``,
JavaScript and every strict parser refuse the whole document. Every JSON ddptui writes (run.json,
summary.json, event lines, each ``--json`` output, the results history) goes through ``dumps``
here, which writes such a value as ``null``; readers that expect a float read ``null`` back as
NaN (``float_or_nan``), so the value is still shown as what it was. Plain Python.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every non-finite float inside it (dicts, lists, tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` of ``value`` with non-finite floats written as ``null``; never a bare NaN."""
    return json.dumps(finite(value), allow_nan=False, **options)


def float_or_nan(value: Any) -> Any:
    """A float field read back: ``null`` (a NaN or infinity when it was written) becomes NaN."""
    return math.nan if value is None else value
