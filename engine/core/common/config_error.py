"""``ConfigError``: a preset, override or device spec that cannot be used. Plain Python.

Its own module so that every validator (``engine.core.config.schema``, ``engine.core.config.devices``,
``engine.core.config.faults``) can raise it without importing the others.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A preset or override that cannot be used.

    ``str()`` is one sentence for the user, naming the file (or override) and the key. The same
    is there in parts, set where the error is raised, for a caller that shows less than the
    sentence (the launch screen's preset list):

    - ``where``: the file or the override the bad value came from (``presets/x.toml``,
      ``override training.epochs=0``); "" where no file is involved (a plan refused on this
      machine). When one error is said of several places (a suite around a preset), the innermost.
    - ``key``: the dotted key at fault (``devices.spec``, ``training.batch_size``); "" when no one
      key is (a file that is not TOML, a run too large for the host's memory).
    - ``reason``: the gist in a few words, readable on its own in a list row ("needs 4 GPUs, 2
      here"); the whole sentence (without ``where``) when the raiser gave no shorter one.
    """

    def __init__(self, message: str, *, where: str = "", key: str = "", reason: str = "") -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
        self.key = key
        self.reason = reason or message

    def within(self, where: str) -> ConfigError:
        """The same error said of ``where``: the sentence gains ``where:`` in front; ``key`` and
        ``reason`` stay, and ``where`` stays the innermost place named."""
        outer = type(self)(str(self), where=where, key=self.key, reason=self.reason)
        outer.where = self.where or where
        return outer
