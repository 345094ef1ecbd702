"""`torchherd check`: validate a config file and say what would launch where.

`check_config(path)` checks the schema, the task references and the device
placement in this process in milliseconds; with `probe=True` it also builds every
task in a fresh interpreter, which catches factories that raise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torchherd.engine.config import ConfigError, Problem, RunConfig, load_config
from torchherd.engine.devices import Inventory, discover_devices
from torchherd.engine.placement import describe_plan, plan_slots


@dataclass(frozen=True)
class CheckReport:
    """The verdict on one config file."""

    ok: bool
    config: RunConfig | None
    problems: list[Problem] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # what would launch where

    def render(self) -> str:
        if self.ok:
            return "ok\n" + "\n".join("  " + line for line in self.lines)
        count = len(self.problems)
        return f"{count} problem{'s' if count != 1 else ''}:\n" + "\n".join(str(p) for p in self.problems)


def check_config(path: str | Path, probe: bool = False, inventory: Inventory | None = None) -> CheckReport:
    """Validate `path`; never raises for a bad config."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        return CheckReport(False, None, exc.problems)
    inventory = inventory if inventory is not None else discover_devices()
    slots, problems = plan_slots(config.devices, inventory, config.source or str(path))
    if probe and not problems:
        from torchherd.engine.placement import plan_validation
        from torchherd.engine.probe import probe_tasks

        background = plan_validation(config, slots, inventory).mode == "background"
        problems = probe_tasks(config, background=background)
    if problems:
        return CheckReport(False, config, problems)
    return CheckReport(True, config, [], describe_plan(config, slots, inventory))
