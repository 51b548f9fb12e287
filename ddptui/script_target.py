"""How the user names their own training script, as ``ddptui run`` and the launch screen's ``o``
both take it: a path to a ``.py`` file, or a module (``-m package.module``), with the script's own
arguments. Plain Python."""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.config.schema import ConfigError, RunConfig, ScriptConfig


def script_config(
    target: str | None, args: Sequence[str] = (), *, module: str | None = None
) -> RunConfig | None:
    """The run config of the script ``target`` names, ``train.py`` or ``-m package.module``, with
    its arguments ``args``; None when ``target`` names no script (so, a preset). ``module`` is
    ``-m`` given apart, as click hands it: then a ``target`` is the module's first argument.
    Whether the file or module can be found is ``engine.core.config.user_code``'s check."""
    text = (target or "").strip()
    if module is None and text.startswith(("-m ", "-m\t")):
        module, text = text[2:].strip(), ""
    if module is not None:
        if not module:
            raise ConfigError("-m needs a module: -m package.module")
        words = (text, *args) if text else tuple(args)
        return RunConfig.for_script(ScriptConfig(module=module, args=words))
    if text.endswith(".py"):
        return RunConfig.for_script(ScriptConfig(path=text, args=tuple(args)))
    return None
