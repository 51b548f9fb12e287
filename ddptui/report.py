"""``ddptui.report(**metrics)``: tell ddptui how your own training script is doing.

    from ddptui.report import report
    ...
    report(loss=loss.item(), accuracy=acc, images_per_s=rate, epoch=epoch)

In a rank of ``ddptui run your_script.py`` it adds the figures to the rank's progress (loss,
accuracy, images/s, or any number you name); anywhere else it does nothing, so the script runs
unchanged under torchrun or plainly. Importing it loads neither textual nor torch.
"""

from __future__ import annotations

from engine.core.runs.script_reporting import current


def report(**metrics: float) -> None:
    """Report numbers for this rank (a no-op outside a ddptui run)."""
    reporter = current()
    if reporter is not None:
        reporter.on_metrics(metrics)
