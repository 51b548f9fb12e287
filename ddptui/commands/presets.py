"""``ddptui presets``: every preset, what it does, and whether it can run on this machine."""

from __future__ import annotations

from typing import Any

import click

from engine.core.common import strict_json
from engine.core.config.presets import list_presets
from engine.core.config.schema import ConfigError
from engine.core.config.toml_io import load_config
from engine.core.host import gpus
from engine.core.plan.resource_guard import check_resources
from engine.core.plan.run_plan import plan_run


@click.command("presets")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
def presets_command(as_json: bool) -> None:
    """List bundled and user presets (~/.config/ddptui/presets or $DDPTUI_PRESETS), each with a
    one-line description and whether it can run here, and why not: `ok`, `no` (cannot run on
    this machine) or `bad` (the file itself is broken: not UTF-8, not TOML, a wrong key)."""
    inventory = gpus.sample_gpus()
    rows: list[dict[str, Any]] = []
    for preset in list_presets():
        description, runnable, broken = "", False, False
        try:
            config = load_config(preset.path, name=preset.name)
        except ConfigError as err:  # the file itself is bad: the others are still listed
            config, broken, reason = None, True, str(err)
        try:
            if config is None:
                raise ConfigError(reason)
            description = config.description
            plan = plan_run(config, inventory.count)
            check_resources(plan, inventory=inventory)  # cores, memory, GPUs: as `run` checks
            reason = f"runs on {plan.devices.describe()}"
            runnable = True
        except ConfigError as err:
            reason = str(err)
        rows.append(
            {
                "name": preset.name,
                "source": "bundled" if preset.bundled else "user",
                "path": str(preset.path),
                "description": description,
                "runnable": runnable,
                "broken": broken,
                "reason": reason,
            }
        )
    if as_json:
        click.echo(strict_json.dumps(rows, indent=2))
        return
    machine = (
        f"{inventory.count} GPU(s)"
        if inventory.count
        else f"no GPU ({inventory.error or 'none found'})"
    )
    click.echo(f"This machine: {machine}\n")
    width = max(len(r["name"]) for r in rows) if rows else 10
    for r in rows:
        mark = "bad" if r["broken"] else "ok " if r["runnable"] else "no "
        user = "" if r["source"] == "bundled" else " [user]"
        click.echo(f"{mark} {r['name']:<{width}}  {r['description']}{user}")
        if r["broken"]:
            click.echo(f"    {'':<{width}}  broken preset file: {r['reason']}")
        elif not r["runnable"]:
            click.echo(f"    {'':<{width}}  cannot run here: {r['reason']}")
