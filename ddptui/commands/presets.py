"""``ddptui presets``: every preset, what it does, and whether it can run on this machine."""

from __future__ import annotations

from typing import Any

import click

from ddptui.cli_common import echo
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


@click.command("presets")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
def presets_command(as_json: bool) -> None:
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
    echo(f"This machine: {machine}\n")
    width = max(len(r["name"]) for r in rows) if rows else 10
    for r in rows:
        mark = "bad" if r["broken"] else "ok " if r["runnable"] else "no "
        user = "" if r["source"] == "bundled" else " [user]"
        echo(f"{mark} {r['name']:<{width}}  {r['description']}{user}")
        if r["broken"]:
            echo(f"    {'':<{width}}  broken preset file: {r['reason']}")
        elif not r["runnable"]:
            echo(f"    {'':<{width}}  cannot run here: {r['reason']}")
