"""``ConfigError``: a preset, override or device spec that cannot be used. Plain Python.

Its own module so that every validator (``engine.core.config.schema``, ``engine.core.config.devices``,
``engine.core.config.faults``) can raise it without importing the others.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A preset or override that cannot be used; the message is one sentence for the user."""
