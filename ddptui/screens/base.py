"""What every ddptui screen shares: the typed app (``ddptui``), the one way a thread worker ends
(``post_read``: its message, or a ``WorkerProblem`` shown where the screen says), and, for the
screens that read on a timer, ``PollingScreen``: the timer, paused while another screen is shown,
and ``f5`` to read now.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, TypeVar, cast

from rich.text import Text
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Static

from ddptui.messages import WorkerProblem

if TYPE_CHECKING:
    from ddptui.app import DdptuiApp

T = TypeVar("T")


class DdptuiScreen(Screen[None]):
    """A screen of the ddptui app."""

    # Where a failed background read is said (a Static's selector); None: the screen says it itself.
    PROBLEM_AT: ClassVar[str | None] = None

    @property
    def ddptui(self) -> DdptuiApp:
        """The app, typed: every screen runs inside a ``DdptuiApp``."""
        return cast("DdptuiApp", self.app)

    def post_read(
        self, source: str, read: Callable[[], T], message: Callable[[T], Message]
    ) -> None:
        """From a thread worker: post ``message(read())``; when the read raises, post a
        ``WorkerProblem`` naming ``source`` instead (the screen shows it and the next read tries
        again)."""
        try:
            result = read()
        except Exception as err:
            self.post_message(WorkerProblem(source, f"{type(err).__name__}: {err}"))
            return
        self.post_message(message(result))

    def on_worker_problem(self, message: WorkerProblem) -> None:
        if self.PROBLEM_AT is not None:
            self.query_one(self.PROBLEM_AT, Static).update(
                Text(f"{message.source}: {message.error}", style="bold red")
            )


class PollingScreen(DdptuiScreen):
    """A screen that reads every ``poll_seconds()`` (the app's list interval unless it says
    otherwise) while it is on show: once as it is shown, then on the timer, which pauses while
    another screen is shown. Each read is ``read`` in a thread worker; ``action_refresh`` (f5)
    reads now."""

    def __init__(self) -> None:
        super().__init__()
        self._timer: Timer | None = None

    def poll_seconds(self) -> float:
        return self.ddptui.list_poll_seconds

    def read(self) -> None:
        """In the worker thread: read what the screen shows and post it (``post_read``)."""
        raise NotImplementedError

    def poll(self) -> None:
        """Read now, in a thread worker. A read still going is marked cancelled, but a thread
        cannot be stopped: its result still lands (snapshot messages coalesce)."""
        self.run_worker(
            self.read,
            name=f"{type(self).__name__}.read",
            group="poll",
            thread=True,
            exclusive=True,
            exit_on_error=False,
        )

    def poll_every(self, seconds: float) -> None:
        """Read every ``seconds`` from now on, in place of the interval the screen started with."""
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_interval(seconds, self.poll)

    def on_mount(self) -> None:
        self._timer = self.set_interval(self.poll_seconds(), self.poll, pause=True)

    def on_screen_resume(self) -> None:
        self.poll()
        if self._timer is not None:
            self._timer.resume()

    def on_screen_suspend(self) -> None:
        if self._timer is not None:
            self._timer.pause()

    def action_refresh(self) -> None:
        self.poll()
