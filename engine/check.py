"""`torchherd check`: validate a config file and say what would launch where.

`check_config(path)` checks the schema, the task references and the device
placement in this process in milliseconds; with `probe=True` it also builds every
task in a fresh interpreter, which catches factories that raise.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from torchherd.engine.config import ConfigError, Problem, RunConfig, load_config
from torchherd.engine.devices import Inventory, discover_devices
from torchherd.engine.placement import describe_plan, plan_slots, plan_validation


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
    if not problems:
        problems = script_problems(config, plan_validation(config, slots, inventory).mode)
    if probe and not problems:
        problems = _probe_tasks(config)
    if problems:
        return CheckReport(False, config, problems)
    return CheckReport(True, config, [], describe_plan(config, slots, inventory))


# ------------------------------------------------------------ script pipelines

HAND_OFF = re.compile(r"\bhand_off\s*\(")
SCAN_LIMIT = 200  # .py files beside a script searched for a hand-off, at most


def _calls_hand_off(script: Path) -> bool:
    """Whether the script, or a module beside it (a training loop often lives there), calls hand_off(...)."""
    files = [script] + sorted(p for p in script.parent.glob("*.py") if p != script)[:SCAN_LIMIT]
    for file in files:
        try:
            if HAND_OFF.search(file.read_text(encoding="utf-8", errors="replace")):
                return True
        except OSError:
            continue
    return False


def script_problems(config: RunConfig, validation_mode: str) -> list[Problem]:
    """A `validate` factory whose script never hands its weights off: nothing would ever be scored."""
    problems = []
    for i, p in enumerate(config.pipelines):
        if p.kind != "script" or not p.validate_factory or validation_mode == "off":
            continue
        script = Path(p.script_ref)
        if script.is_file() and not _calls_hand_off(script):
            problems.append(Problem(config.source, f"pipelines[{i}].validate", (
                f"{script.name} never calls herd.hand_off(model), so validation would have nothing to score: "
                "add `import torchherd.client as herd` and `herd.hand_off(model)` after each epoch, "
                "or remove `validate`")))
    return problems


def _probe_tasks(config: RunConfig) -> list[Problem]:
    """Build every task pipeline's task in a fresh process; script pipelines have no task to build."""
    from torchherd.engine.probe import probe_tasks

    tasks = [i for i, p in enumerate(config.pipelines) if p.kind == "task"]
    if not tasks:
        return []
    found = probe_tasks(config.model_copy(update={"pipelines": [config.pipelines[i] for i in tasks]}))
    # The probe numbers the pipelines it was given; name them as they are in the file.
    renumber = re.compile(r"^pipelines\[(\d+)\]")
    return [Problem(p.file, renumber.sub(lambda m: f"pipelines[{tasks[int(m[1])]}]", p.key), p.message)
            for p in found]
