"""`torchherd check`: validate a config file and say what would launch where.

`check_config(path)` checks the schema, the task references and the device
placement in this process in milliseconds. It also reads each task file with
`ast` (no import, so no user code runs) and reports a factory the file does not
define, or a syntax error. With `probe=True` it then builds every task in a fresh
interpreter, which catches factories that raise or return the wrong thing.
"""
from __future__ import annotations

import os
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from ..config.load import load_config
from ..config.problems import ConfigError, Problem, display_path
from ..config.schema import Pipeline, RunConfig
from ..config.validated import reports_validation, unranked_line
from ..hardware.devices import Inventory, discover_devices
from ..hardware.grants import Holdings
from ..hardware.ledger import Ledger, UnsafeLedger
from ..hardware.occupancy import OccupancyReader
from ..hardware.placement import plan_slots, plan_validation
from ..hardware.slots import Slot
from ..protocol.names import ValidationMode
from ..protocol.private import UnsafeRuntimeDir
from ..runners.registry import runner_for
from .plan import describe_plan, gang_problems
from .probe import grouped_task_problems, lightning_factories, probe_notes, probe_tasks, task_problems


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


def check_config(path: str | Path, probe: bool = False, inventory: Inventory | None = None,
                 runs_dir: str | Path | None = None) -> CheckReport:
    """Validate `path` (its runs go to `runs_dir`, default the config's); never raises for a bad config."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        return CheckReport(False, None, exc.problems + sound_task_problems(exc))
    inventory = inventory if inventory is not None else discover_devices()
    slots, problems = plan_slots(config.devices, inventory, display_path(path))
    problems += runs_dir_problems(config, runs_dir)
    problems += ledger_problems(config)
    problems += gang_problems(config, slots) if slots else []
    problems += static_task_problems(config)
    if slots:
        problems += runner_problems(config, plan_validation(config, slots, inventory).mode,
                                    skip={p.pipeline for p in problems})
    background = plan_validation(config, slots, inventory).mode == ValidationMode.BACKGROUND
    if probe and not problems:
        problems = _probe_tasks(config, background)
    if problems:
        return CheckReport(False, config, problems)
    held = holdings_now(config, slots)
    lines = describe_plan(config, slots, inventory, held) + list(held.notices) + sweep_lines(config)
    if probe:
        lines = _say_lightning(config, lines, background) + _say_notes(config, background)
    return CheckReport(True, config, [], lines)


def holdings_now(config: RunConfig, slots: list[Slot]) -> Holdings:
    """What the user's other runs (the ledger) and other programs (NVML) hold of `slots` now; nothing for a
    cluster, whose accounting is Ray's."""
    if config.cluster.backend != "local" or not slots:
        return Holdings()
    try:
        ledger: Ledger | None = Ledger()
    except (OSError, UnsafeRuntimeDir):  # a refused ledger is a problem of its own (ledger_problems)
        ledger = None
    leases = tuple(ledger.leases()) if ledger is not None else ()
    indices = [s.gpu.index for s in slots if s.gpu is not None]
    supervisors = {s.pid for s in ledger.presences()} if ledger is not None and indices else set()
    notices = tuple(ledger.notices()) if ledger is not None else ()
    if not indices:
        return Holdings(leases, notices=notices)
    reader = OccupancyReader()
    try:
        return Holdings(leases, reader.read(indices, supervisors), reader.links(indices), notices)
    finally:
        reader.close()


def ledger_problems(config: RunConfig) -> list[Problem]:
    """The device ledger's folder, if it is refused (someone else's, or others can write it): no run of this
    config could grant a device from it."""
    if config.cluster.backend != "local":
        return []
    try:
        Ledger()
    except UnsafeLedger as exc:
        return [Problem(str(exc.folder), "", exc.why)]
    except (OSError, UnsafeRuntimeDir):  # the runtime folder's own problems are the control socket's to say
        pass
    return []


SHOWN_TRIALS = 4  # trials `check` spells out; the pipeline lines above list every one


def sweep_lines(config: RunConfig) -> list[str]:
    """A sweep's trial count, its scheduler and its first few trials with their values."""
    sweep = config.sweep
    if sweep is None:
        return []
    first = config.pipelines[0]
    limit = first.max_epochs if sweep.rung_unit == "epoch" else first.max_steps
    lines = [sweep.describe(len(config.pipelines), limit)]
    if not reports_validation(config.pipelines, config.validation.mode):
        lines.append("  " + unranked_line(any(reports_loss(p) for p in config.pipelines), sweep.scheduler))
    for pipe in config.pipelines[:SHOWN_TRIALS]:
        lines.append(f"  {pipe.name}: " + ", ".join(f"{k} = {v!r}" for k, v in pipe.trial.items()))
    if len(config.pipelines) > SHOWN_TRIALS:
        lines.append(f"  ... and {len(config.pipelines) - SHOWN_TRIALS} more")
    return lines


def reports_loss(pipe: Pipeline) -> bool:
    """Whether a pipeline reports a train loss: a task's or Lightning module's does, a script's through its
    `metrics` lines or torchherd.client."""
    from ..runners.script import uses_client

    return pipe.script is None or bool(pipe.metrics) or uses_client(Path(pipe.script_ref))


def runs_dir_problems(config: RunConfig, runs_dir: str | Path | None = None) -> list[Problem]:
    """The runs folder, if this user cannot create run directories in it (checked before anything is built)."""
    target = Path(runs_dir if runs_dir is not None else config.runs_dir).expanduser().absolute()
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return []
    why = "is not a folder" if not existing.is_dir() else "is not writable by you"
    where = "" if existing == target else f" ({display_path(existing)} {why})"
    return [Problem(display_path(config.source), "runs_dir",
                    f"cannot create run directories in {display_path(target)}{where if where else ': it ' + why}; "
                    "set runs_dir in the config or pass --runs-dir")]


def static_task_problems(config: RunConfig) -> list[Problem]:
    """Task files that do not parse or do not define the factory the config names, read without importing
    (each kind's runner reads what its pipelines name: engine/runners/base.py `Runner.scan`)."""
    return task_problems(config, _scan(dict(enumerate(config.pipelines))))


def sound_task_problems(exc: ConfigError) -> list[Problem]:
    """`static_task_problems` for the pipelines of a config that failed to load but parsed on their own,
    so one pipeline's missing file does not hide another's undefined factory."""
    file = exc.problems[0].file if exc.problems else ""
    tasks = {i: p.task for i, p in exc.sound.items()}
    found = grouped_task_problems(file, exc.defaults_task, tasks, _scan(exc.sound))
    return [p for p in found if p not in exc.problems]


def _scan(pipelines: dict) -> dict[int, str]:
    """Each pipeline's runner reading its factory without importing it: index -> what is wrong."""
    errors = {i: runner_for(pipe.kind).scan(pipe) for i, pipe in pipelines.items()}
    return {i: error for i, error in errors.items() if error}


def runner_problems(config: RunConfig, validation_mode: str,
                    skip: AbstractSet[int | None] = frozenset()) -> list[Problem]:
    """What each kind's runner finds wrong with its pipelines, but those in `skip` (a script's `validate`
    factory whose script never hands its weights off, say): `Runner.check`."""
    file = display_path(config.source)
    return [Problem(file, f"pipelines[{i}].{key}", message) for i, p in enumerate(config.pipelines)
            if i not in skip for key, message in runner_for(p.kind).check(p, validation_mode)]


def _say_lightning(config: RunConfig, lines: list[str], background: bool) -> list[str]:
    """`lines` saying which plain tasks train under Lightning: those whose factory returned a
    LightningTask, which only the probe (building them) can tell."""
    names = lightning_factories(config, background)
    tasks = {p.name: p.task or "" for p in config.pipelines if p.name in names}
    out = []
    for line in lines:
        name, sep, rest = line.partition(": task ")
        if sep and name in tasks and rest.startswith(tasks[name]):
            line = f"{name}: task {tasks[name]} (Lightning Trainer.fit){rest[len(tasks[name]):]}"
        out.append(line)
    return out


def _say_notes(config: RunConfig, background: bool) -> list[str]:
    """What building the tasks told (a Task without val_data is validated by nobody), once per note."""
    if config.validation.mode == ValidationMode.OFF:
        return []  # nothing is validated anyway
    return [f"{_names(names)}: {note}" for note, names in probe_notes(config, background).items()]


def _names(names: list[str]) -> str:
    """'a, b' or, for a sweep's many trials, 'a, b, c, d and 28 more'."""
    more = len(names) - SHOWN_TRIALS
    return ", ".join(names[:SHOWN_TRIALS]) + (f" and {more} more" if more > 0 else "")


def _probe_tasks(config: RunConfig, background: bool) -> list[Problem]:
    """Build every task pipeline's task in a fresh process (script pipelines have none)."""
    return probe_tasks(config, background=background)
