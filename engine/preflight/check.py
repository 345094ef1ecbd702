"""`torchherd check`: validate a config file and say what would launch where.

`check_config(path)` checks the schema, the task references and the device
placement in this process in milliseconds. It also reads each task file with
`ast` (no import, so no user code runs) and reports a factory the file does not
define, or a syntax error. With `probe=True` it then builds every task in a fresh
interpreter, which catches factories that raise or return the wrong thing.
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..config.schema import BUILTIN_TASKS, LIGHTNING_PREFIX, ConfigError, Problem, RunConfig, display_path, load_config
from ..hardware.devices import Inventory, discover_devices
from ..hardware.placement import describe_plan, gang_problems, plan_slots, plan_validation


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
    slots, problems = plan_slots(config.devices, inventory, display_path(path))
    problems += gang_problems(config, slots) if slots else []
    problems += static_task_problems(config)
    if not problems:
        problems = script_problems(config, plan_validation(config, slots, inventory).mode)
    background = plan_validation(config, slots, inventory).mode == "background"
    if probe and not problems:
        problems = _probe_tasks(config, background)
    if problems:
        return CheckReport(False, config, problems)
    lines = describe_plan(config, slots, inventory)
    return CheckReport(True, config, [], _say_lightning(config, lines, background) if probe else lines)


def task_problems(config: RunConfig, errors: dict[int, str]) -> list[Problem]:
    """Problems for the pipelines whose task failed (`errors`: pipeline index -> message).

    A task every pipeline inherits from [defaults] and that fails the same way for each is one
    problem, at `defaults.task`, not one per pipeline.
    """
    file = display_path(config.source) if config.source else ""
    inherited = [i for i, p in enumerate(config.pipelines)
                 if config.defaults.task is not None and p.task == config.defaults.task]
    messages = {errors.get(i) for i in inherited}
    once: set[int] = set()
    out = []
    if inherited and len(messages) == 1 and None not in messages:
        out.append(Problem(file, "defaults.task", errors[inherited[0]]))
        once = set(inherited)
    for i in sorted(errors):
        if i not in once:
            out.append(Problem(file, f"pipelines[{i}].task", errors[i]))
    return out


def static_task_problems(config: RunConfig) -> list[Problem]:
    """Task files that do not parse or do not define the factory the config names, read without importing."""
    errors = {}
    for i, pipe in enumerate(config.pipelines):
        if pipe.kind != "task":
            continue  # a script has no factory to look for
        error = _scan_ref((pipe.task_ref or pipe.task).removeprefix(LIGHTNING_PREFIX))
        if error:
            errors[i] = error
    return task_problems(config, errors)


def _scan_ref(ref: str) -> str:
    if ref in BUILTIN_TASKS or ":" not in ref:
        return ""
    target, _, attr = ref.rpartition(":")
    if target.endswith(".py"):
        path, label = Path(target), display_path(target)
    else:
        try:  # the loader already looked the module up, so its parents are imported; this is a dict lookup
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            return ""
        origin = spec.origin if spec is not None else None
        if not origin or not origin.endswith(".py"):
            return ""  # an extension or namespace package: only the probe can tell
        path, label = Path(origin), target
    names, syntax = top_level_names(path)
    if syntax:
        return syntax
    if names is None or attr in names:
        return ""
    close = difflib.get_close_matches(attr, sorted(names), n=1)
    return f"{label} has no {attr!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


# (path, mtime in ns, size in bytes) -> (names, syntax error): the picker asks again on every highlight.
_SCANS: dict[tuple[str, int, int], tuple[frozenset[str] | None, str]] = {}
_SCANS_LOCK = threading.Lock()


def top_level_names(path: Path) -> tuple[frozenset[str] | None, str]:
    """(the names `path` binds at module level, or None when only running it could tell; a syntax error or "")."""
    try:
        st = os.stat(path)
        key = (str(path), st.st_mtime_ns, st.st_size)
        with _SCANS_LOCK:
            if key in _SCANS:
                return _SCANS[key]
        source = Path(path).read_bytes()
    except OSError:
        return None, ""  # the loader already said whether it exists; leave the rest to the probe
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        result: tuple[frozenset[str] | None, str] = (None, f"syntax error in {display_path(path)} line "
                                                           f"{exc.lineno}: {exc.msg}")
    except ValueError:  # null bytes
        result = (None, "")
    else:
        result = (_bound_names(tree), "")
    with _SCANS_LOCK:
        _SCANS[key] = result
    return result


def _stored(node: ast.AST | None) -> set[str]:
    """Names an expression or simple statement assigns (targets, `as` names, walrus)."""
    if node is None:
        return set()
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            out.add(sub.id)
        elif isinstance(sub, (ast.MatchAs, ast.MatchStar)) and sub.name:
            out.add(sub.name)
        elif isinstance(sub, ast.MatchMapping) and sub.rest:
            out.add(sub.rest)
    return out


def _bound_names(tree: ast.Module) -> frozenset[str] | None:
    """Names bound at module level; None if the module could bind names no parser can see."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        if isinstance(node, ast.Name) and node.id in ("globals", "exec", "vars"):
            return None
        if isinstance(node, ast.Attribute) and node.attr == "modules" and \
                isinstance(node.value, ast.Name) and node.value.id == "sys":
            return None  # sys.modules[__name__] tricks
    names: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:  # statements that run at import time: the module body and the blocks of its if/for/try/with
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None  # a module __getattr__ answers for any name
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.While)):
            names |= _stored(node.test)
            stack += node.body + node.orelse
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            names |= _stored(node.target) | _stored(node.iter)
            stack += node.body + node.orelse
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                names |= _stored(item.optional_vars) | _stored(item.context_expr)
            stack += node.body
        elif isinstance(node, (ast.Try, ast.TryStar)):
            stack += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                names |= {handler.name} if handler.name else set()
                stack += handler.body
        elif isinstance(node, ast.Match):
            names |= _stored(node.subject)
            for case in node.cases:
                names |= _stored(case.pattern)
                stack += case.body
        else:
            names |= _stored(node)
    return frozenset(names)


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
            problems.append(Problem(display_path(config.source), f"pipelines[{i}].validate", (
                f"{script.name} never calls herd.hand_off(model), so validation would have nothing to score: "
                "add `import torchherd.client as herd` and `herd.hand_off(model)` after each epoch, "
                "or remove `validate`")))
    return problems


def _say_lightning(config: RunConfig, lines: list[str], background: bool) -> list[str]:
    """`lines` saying which plain tasks train under Lightning: those whose factory returned a
    LightningTask, which only the probe (building them) can tell."""
    from .probe import lightning_factories

    names = lightning_factories(config, background)
    tasks = {p.name: p.task for p in config.pipelines if p.name in names}
    out = []
    for line in lines:
        name, sep, rest = line.partition(": task ")
        if sep and name in tasks and rest.startswith(tasks[name]):
            line = f"{name}: task {tasks[name]} (Lightning Trainer.fit){rest[len(tasks[name]):]}"
        out.append(line)
    return out


def _probe_tasks(config: RunConfig, background: bool) -> list[Problem]:
    """Build every task pipeline's task in a fresh process (script pipelines have none)."""
    from .probe import probe_tasks

    return probe_tasks(config, background=background)
