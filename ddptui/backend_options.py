"""The options each backend adds to ``ddptui run`` (its flag, ``--nodes``, ...), made from what
the backend declares (``engine.core.backends.interface.RunOptions``), and what the command makes of
them: which backend runs the run, and the overrides of that backend's config section. The run
command's help teaches each backend in that backend's own lines."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from engine.core.backends.interface import RunOption
from engine.core.backends.registry import LOCAL, Backend, backends
from engine.core.config.schema import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def _placed_by() -> list[Backend]:
    """The backends a run may be sent to with a flag of its own, as registered."""
    return [b for b in backends() if b.run_options is not None]


def _dest(backend: Backend, option: RunOption | None = None) -> str:
    """The keyword click passes an option of ``backend`` as (its flag's when ``option`` is None)."""
    name = option.name if option is not None else "flag"
    return f"backend_{backend.name}_{name.lstrip('-').replace('-', '_')}"


def _click_option(backend: Backend, option: RunOption) -> Callable[[F], F]:
    if option.kind == "items":
        return click.option(
            option.name,
            _dest(backend, option),
            multiple=True,
            metavar=option.metavar or None,
            help=option.help,
        )
    kind = click.IntRange(min=1) if option.kind == "count" else None
    return click.option(option.name, _dest(backend, option), type=kind, help=option.help)


@dataclass(frozen=True)
class PlacementAsked:
    """Where ``ddptui run`` was asked to run, and what the backends' options set."""

    backend: Backend = LOCAL  # the one whose flag was given; this machine when none was
    flags: tuple[str, ...] = ()  # every backend flag given
    # (backend, option, value) of each option given, in the order the backends declare them
    given: tuple[tuple[Backend, RunOption, Any], ...] = field(default_factory=tuple)

    def overrides(self) -> dict[str, Any]:
        """The options given, as ``apply_overrides`` takes them; ConfigError (one sentence) for
        a backend's option without its flag, or an item its backend cannot read."""
        if len(self.flags) > 1:
            raise ConfigError(f"{' and '.join(self.flags)}: give one place to run")
        elsewhere = [(b, o) for b, o, _ in self.given if b is not self.backend]
        if elsewhere:
            names = ", ".join(o.name for _, o in elsewhere)
            flag = elsewhere[0][0].run_options.flag  # type: ignore[union-attr]
            raise ConfigError(f"{names} {'need' if ',' in names else 'needs'} {flag}")
        found: dict[str, Any] = {}
        for _, option, value in self.given:
            if option.kind == "items" and option.parse_item is not None:
                value = dict(option.parse_item(item) for item in value)
            found[option.key] = value
        return found


def backend_options(func: F) -> F:
    """Each registered backend's flag and options on a command; the command gets ``placement``
    (a ``PlacementAsked``) instead of them."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flags: list[Backend] = []
        given: list[tuple[Backend, RunOption, Any]] = []
        for backend in _placed_by():
            assert backend.run_options is not None
            if kwargs.pop(_dest(backend)):
                flags.append(backend)
            for option in backend.run_options.options:
                value = kwargs.pop(_dest(backend, option))
                if value is not None and value != ():
                    given.append((backend, option, value))
        asked = PlacementAsked(
            backend=flags[0] if flags else LOCAL,
            flags=tuple(b.run_options.flag for b in flags if b.run_options),
            given=tuple(given),
        )
        return func(*args, placement=asked, **kwargs)

    decorated: Any = wrapper
    for backend in reversed(_placed_by()):
        declared = backend.run_options
        assert declared is not None
        for option in reversed(declared.options):
            decorated = _click_option(backend, option)(decorated)
        decorated = click.option(declared.flag, _dest(backend), is_flag=True, help=declared.help)(
            decorated
        )
    return decorated


def teaching_lines() -> str:
    """Each backend's own help lines, as a click help text keeps them (one paragraph each)."""
    paragraphs = [
        "\b\n" + "\n".join(b.run_options.teaching)
        for b in _placed_by()
        if b.run_options is not None and b.run_options.teaching
    ]
    return "\n\n".join(paragraphs)
