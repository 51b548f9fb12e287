"""Resuming a run from the Run and Runs screens (``R``): the resume in a thread worker (through
``ddptui.actions``, as ``ddptui resume`` does it), its sentence as a notification, and the run's
screen attached to the new attempt's launcher."""

from __future__ import annotations

from textual import work

from ddptui.messages import RunResumed
from ddptui.screens.base import PollingScreen
from engine.core.common.statuses import RunStatus
from engine.core.common.visible_text import visible
from engine.core.runs.attempts import RESUMABLE, RESUMABLE_SAID
from engine.core.runs.rundir import RunDir


def resumable(status: RunStatus) -> bool:
    """A run that can go on as a next attempt (``RESUMABLE``)."""
    return status in RESUMABLE


class ResumingScreen(PollingScreen):
    """A screen with a resume key: one resume at a time, its outcome said and shown."""

    resuming = False

    def resume(self, run_dir: RunDir, status: RunStatus) -> None:
        """Resume ``run_dir`` (now ``status``) in a worker, unless it cannot go on."""
        if self.resuming:
            self.notify("A resume is already in progress.")
            return
        if not resumable(status):
            self.notify(
                f"{visible(run_dir.run_id, one_line=True)} is {status}: {RESUMABLE_SAID}.",
                severity="warning",
            )
            return
        self.resuming = True
        self.resume_run(run_dir)

    @work(thread=True, exclusive=True, exit_on_error=False, group="resume")
    def resume_run(self, run_dir: RunDir) -> None:
        try:
            started, said = self.ddptui.actions.resume_run(run_dir)
        except Exception as err:  # ResumeRefused, RunDirError: one sentence, nothing started
            self.post_message(RunResumed(run_dir, None, str(err)))
            return
        self.post_message(RunResumed(run_dir, started, said))

    def on_run_resumed(self, message: RunResumed) -> None:
        self.resuming = False
        if message.started is None:
            self.notify(message.report, title="Not resumed", severity="error")
            return
        self.notify(message.report, title="Resumed")
        self.ddptui.open_run(message.run_dir, message.started)
