"""``ddptui presets``: every preset, what it does, and whether it can run on this machine."""

from __future__ import annotations

from typing import Any

import click

from ddptui.cli_common import echo
from ddptui.cli_table import Column, fit_line, output_width, render_table, wide_option
from engine.core.common import strict_json
from engine.core.host import gpus
from engine.core.plan.preset_check import PresetCheck, check_presets
from engine.core.plan.resource_guard import ResourceCheck, check_resources
from engine.core.plan.run_plan import RunPlan


def preset_row(check: PresetCheck) -> dict[str, Any]:
    """One preset as ``--json`` lists it."""
    plan = check.plan
    return {
        "name": check.name,
        "source": "bundled" if check.bundled else "user",
        "path": str(check.path),
        "description": check.config.description if check.config is not None else "",
        "runnable": check.runnable,
        "broken": check.broken,
        "reason": f"runs on {plan.devices.describe()}" if plan is not None else check.reason,
    }


PRESET_COLUMNS = (
    Column(""),
    Column("PRESET"),
    Column("DESCRIPTION", shrink=0, min_width=20, wrap=True),
)


@click.command("presets")
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
def presets_command(wide: bool, as_json: bool) -> None:
    """List bundled and user presets (~/.config/ddptui/presets or $DDPTUI_PRESETS), each with a
    one-line description and whether it can run here, and why not: `ok`, `no` (cannot run on
    this machine) or `bad` (the file itself is broken: not UTF-8, not TOML, a wrong key)."""
    inventory = gpus.sample_gpus()

    def fits(plan: RunPlan) -> ResourceCheck:  # cores, memory, GPUs: as `run` checks them
        return check_resources(plan, inventory=inventory)

    rows = [preset_row(check) for check in check_presets(inventory.count, fits)]
    if as_json:
        click.echo(strict_json.dumps(rows, indent=2))
        return
    machine = (
        f"{inventory.count} GPU(s)"
        if inventory.count
        else f"no GPU ({inventory.error or 'none found'})"
    )
    width = output_width(wide)
    echo(fit_line(f"This machine: {machine}", width))
    echo("")
    table = []
    for r in rows:
        mark = "bad" if r["broken"] else "ok" if r["runnable"] else "no"
        user = "" if r["source"] == "bundled" else " [user]"
        table.append((mark, r["name"], f"{r['description']}{user}"))
        if r["broken"]:
            table.append(("", "", f"broken preset file: {r['reason']}"))
        elif not r["runnable"]:
            table.append(("", "", f"cannot run here: {r['reason']}"))
    # Names are what a user types: they keep their width; what follows wraps at word boundaries.
    for line in render_table(PRESET_COLUMNS, table, width):
        echo(line)
