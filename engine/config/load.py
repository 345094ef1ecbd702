"""Reading a torchherd TOML file into a validated `RunConfig`, or a `ConfigError` naming every problem.

`load_config(path)` reads the file; `parse_config` checks a decoded document: each
problem with its key path, pipelines merged over `[defaults]`, tasks and scripts resolved.
"""
from __future__ import annotations

import difflib
import importlib.util
import json
import os
import shlex
import tomllib
from pathlib import Path
from typing import cast

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from ..protocol.names import PipelineKind
from .effects import no_effect
from .installed import optional_problems
from .placeholders import FILLED_KEYS, fill_config
from .problems import ConfigError, Problem, display_path
from .schema import (
    BUILTIN_TASKS,
    LIGHTNING_PREFIX,
    RESOLVED,
    SCRIPT_ONLY,
    TABLES,
    Pipeline,
    PipelineSettings,
    RunConfig,
)
from .sweep import SweepConfig
from .trials import expand_pipelines, flat_space, space_problems
from .values import Table


def _key_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _message(err: ErrorDetails, fields: list[str]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        name = str(err["loc"][-1])
        close = difflib.get_close_matches(name, fields, n=1)
        if close:
            return f"unknown key (did you mean '{close[0]}'?)"
        if "params" in fields:
            return "unknown key (task parameters go in the pipeline's params table)"
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = err.get("msg", "invalid")
    if msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    if kind == "list_type":
        return f"{msg} (got {err.get('input')!r}): {_as_array(err)}"
    if "input" in err and kind not in ("model_type", "dict_type"):
        msg += f" (got {err['input']!r})"
    return msg


def _as_array(err: ErrorDetails) -> str:
    """How the key is written as a TOML array, from the value given where it can be: `command = "notify-send
    hi"` is `command = ["notify-send", "hi"]`."""
    key = next((str(p) for p in reversed(err["loc"]) if isinstance(p, str) and not _is_branch(p)), "key")
    given = err.get("input")
    try:
        words = shlex.split(given) if isinstance(given, str) else []
    except ValueError:  # unbalanced quotes
        words = []
    example = ", ".join(json.dumps(w) for w in words) if words else '"a", "b"'
    return f"write it as an array, e.g. {key} = [{example}]"


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Known keys of the table that `loc` points into (for 'did you mean')."""
    names = list(model.model_fields)
    if len(loc) >= 2:
        sub = TABLES.get(loc[0]) if isinstance(loc[0], str) else None
        if sub is not None:
            names = [f.alias or n for n, f in sub.model_fields.items()]
    return [n for n in names if n not in RESOLVED]


def _is_branch(part: int | str) -> bool:
    return isinstance(part, str) and (part in ("int", "float", "str", "bool", "none")
                                      or part.startswith(("list[", "literal[", "function-")))


def _problems(exc: ValidationError, file: str, model: type[BaseModel],
              prefix: tuple[int | str, ...] = ()) -> list[Problem]:
    out = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"])
        # Pydantic names union branches in the location ("int", "literal['auto']"); drop them.
        loc = tuple(p for p in loc if not _is_branch(p))
        out.append(Problem(file, _key_path(loc), _message(err, _fields_at(model, loc))))
    seen, unique = set(), []
    for p in out:
        if (p.key, p.message) not in seen:
            seen.add((p.key, p.message))
            unique.append(p)
    return _one_per_union(unique)


def _one_per_union(problems: list[Problem]) -> list[Problem]:
    """A value no branch of a union accepts is one problem ("Input should be a valid integer or 'auto' (got
    'two')"), not one per branch."""
    out: list[Problem] = []
    for p in problems:
        prev = out[-1] if out else None
        head, _, got = p.message.partition(" (got ")
        if prev and prev.key == p.key and head.startswith(SHOULD) and prev.message.startswith(SHOULD) \
                and prev.message.endswith(f" (got {got}"):
            prev_head = prev.message[:-len(f" (got {got}")]
            out[-1] = Problem(p.file, p.key, f"{prev_head} or {head[len(SHOULD):]} (got {got}")
        else:
            out.append(p)
    return out


SHOULD = "Input should be "


def resolve_task(task: str, base_dir: Path) -> tuple[str, str | None]:
    """Turn a task string into an absolute reference, or say what is wrong with it."""
    if task.startswith(LIGHTNING_PREFIX):
        if importlib.util.find_spec("lightning") is None:  # found without importing it (seconds)
            return task, 'Lightning is not installed: pip install "torchherd[lightning]"'
        inner = task[len(LIGHTNING_PREFIX):]
        if ":" not in inner:
            return task, (f"{task!r}: name the LightningModule as 'lightning:path/to/file.py:Class' "
                          "or 'lightning:package.module:Class'")
        ref, err = resolve_task(inner, base_dir)
        return LIGHTNING_PREFIX + ref, err
    if task in BUILTIN_TASKS:
        return task, None
    if ":" not in task:
        return task, (f"unknown task {task!r}: use a built-in task ({', '.join(BUILTIN_TASKS)}), "
                      "'path/to/file.py:build' or 'package.module:build'")
    target, _, attr = task.rpartition(":")
    if not attr.isidentifier():
        return task, f"{attr!r} after ':' is not a Python name"
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_absolute():
            path = (base_dir / path).resolve()
        if not path.is_file():
            return task, f"task file not found: {display_path(path)}"
        return f"{path}:{attr}", None
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as exc:
        return task, f"cannot find module {target!r}: {exc}"
    if spec is None:
        return task, f"cannot find module {target!r} (is it installed or on PYTHONPATH?)"
    return task, None


def resolve_kind(model: Pipeline, own: Table, i: int, file: str,
                 base_dir: Path) -> tuple[dict[str, str | bool], list[Problem]]:
    """The loader's fields for one pipeline (`task_ref`, or `script_ref`, `workdir`, `validate_ref`) and the
    problems with its `task` or `script`; `own` is the pipeline's table as written, without [defaults]."""
    def where(key: str) -> str:
        return f"pipelines[{i}].{key}" if key in own else f"defaults.{key}"

    if model.task is not None and model.script is not None:
        both = "`task` and `script` are both set: a pipeline runs one or the other"
        return {}, [Problem(file, where("script"), both)]
    if model.script is None:
        only = "only applies to a `script` pipeline (this one runs a `task`)"
        problems = [Problem(file, f"pipelines[{i}].{key}", only) for key in SCRIPT_ONLY if key in own]
        if model.task is None:
            missing = "required key is missing: set `task` or `script` (here or in [defaults])"
            return {}, [*problems, Problem(file, f"pipelines[{i}].task", missing)]
        ref, err = resolve_task(model.task, base_dir)
        return {"task_ref": ref}, problems + ([Problem(file, where("task"), err)] if err else [])
    problems = []
    path = Path(model.script)
    path = path if path.is_absolute() else (base_dir / path).resolve()
    if not path.is_file():
        problems.append(Problem(file, where("script"), f"script not found: {path}"))
    workdir = path.parent if model.cwd is None else (base_dir / model.cwd).resolve()
    if model.cwd is not None and not workdir.is_dir():
        problems.append(Problem(file, where("cwd"), f"not a folder: {display_path(workdir)}"))
    update: dict[str, str | bool] = {"script_ref": str(path), "workdir": str(workdir)}
    if model.validate_factory is not None:
        ref, err = resolve_task(model.validate_factory, base_dir)
        update["validate_ref"] = ref
        if err:
            problems.append(Problem(file, where("validate"), err.replace("task", "validate factory", 1)))
    return update, problems


def parse_config(data: Table, file: str, base_dir: Path | None = None) -> RunConfig:
    """Validate a decoded TOML document; raise ConfigError naming every problem."""
    base_dir = base_dir or Path(file).resolve().parent
    shown = display_path(file)  # one path style in every problem, whether from here or from the probe
    problems: list[Problem] = []
    raw_defaults = _defaults_table(data, shown, problems)
    raw_pipelines = _pipelines_table(data, shown, problems)
    sweep = _sweep_table(data, shown, problems)
    if sweep is not None:
        raw_pipelines = expand_pipelines(raw_pipelines, sweep)
    names: dict[str, int] = {}
    pipelines = [_parse_pipeline(i, pipe, raw_defaults, shown, base_dir, names, problems)
                 for i, pipe in enumerate(raw_pipelines)]
    top = _parse_top(data, shown, problems)
    problems += optional_problems(top, shown, base_dir) if top is not None else []
    if sweep is not None:
        problems += _swept_without_effect(sweep, pipelines, [_merged(p, raw_defaults) for p in raw_pipelines], shown)
    if problems:
        raise ConfigError(problems, _sound(pipelines, problems), _defaults_task(raw_defaults, problems))
    assert top is not None
    return top.model_copy(update={
        "name": top.name or Path(file).stem,
        "defaults": PipelineSettings.model_validate(raw_defaults),
        "pipelines": pipelines,
        "sweep": sweep,
        "source": str(Path(file).resolve()) if os.path.exists(file) else file,
    })


def _swept_without_effect(sweep: SweepConfig, pipelines: list[Pipeline | None], tables: list[Table],
                          shown: str) -> list[Problem]:
    """A swept pipeline key that does nothing for the pipelines of some kind (a Lightning pipeline's batch_size):
    its trials would train alike. `tables`: each pipeline as written over [defaults], where a script may pass
    the key on in its args ("{batch_size}"), which is an effect."""
    out = []
    for key in flat_space(sweep.space):
        for pipe, table in zip(pipelines, tables):
            passed = any(f"{{{key}}}" in str(table.get(k, "")) for k in FILLED_KEYS)
            why = no_effect(pipe, key) if pipe is not None and not passed else None
            if why is not None and pipe is not None:
                out.append(Problem(shown, f"sweep.space.{key}", f"has no effect on {pipe.name} ({pipe.kind} "
                                   f"pipeline): {why}"))
                break
    return out


def _sound(pipelines: list[Pipeline | None], problems: list[Problem]) -> dict[int, Pipeline]:
    """The pipelines, by index, that parsed with no problem of their own."""
    own = {p.pipeline for p in problems}
    return {i: p for i, p in enumerate(pipelines) if p is not None and i not in own}


def _defaults_task(raw_defaults: Table, problems: list[Problem]) -> str | None:
    """[defaults] task as written, unless [defaults] itself has a problem with it."""
    task = raw_defaults.get("task")
    return task if isinstance(task, str) and not any(p.key == "defaults.task" for p in problems) else None


def _defaults_table(data: Table, shown: str, problems: list[Problem]) -> Table:
    """`[defaults]` as written ({} when it is not a table), its problems added to `problems`."""
    raw_defaults = data.get("defaults", {})
    if not isinstance(raw_defaults, dict):
        problems.append(Problem(shown, "defaults", "must be a table ([defaults])"))
        raw_defaults = {}
    try:
        PipelineSettings.model_validate(raw_defaults)
    except ValidationError as exc:
        problems += _problems(exc, shown, RunConfig, ("defaults",))
    return raw_defaults


def _sweep_table(data: Table, shown: str, problems: list[Problem]) -> SweepConfig | None:
    """`[sweep]` validated (None when absent or wrong, said in `problems`), each space key checked."""
    if "sweep" not in data:
        return None
    try:
        sweep = SweepConfig.model_validate(data["sweep"])
    except ValidationError as exc:
        problems += _problems(exc, shown, RunConfig, ("sweep",))
        return None
    found = space_problems(sweep, shown)
    problems += found
    return None if found else sweep


def _pipelines_table(data: Table, shown: str, problems: list[Problem]) -> list[Table]:
    """The `[[pipelines]]` tables as written ([] when missing or malformed, said in `problems`)."""
    raw_pipelines = data.get("pipelines")
    if raw_pipelines is None or raw_pipelines == []:
        problems.append(Problem(shown, "pipelines", "no pipelines: add at least one [[pipelines]] table"))
        return []
    if not isinstance(raw_pipelines, list) or not all(isinstance(p, dict) for p in raw_pipelines):
        problems.append(Problem(shown, "pipelines", "must be an array of tables ([[pipelines]])"))
        return []
    return cast("list[Table]", raw_pipelines)  # each one a table, checked above


def _merged(pipe: Table, raw_defaults: Table) -> Table:
    """One pipeline's table over `[defaults]`; `params` and `datamodule_params` tables merge key by key."""
    merged = {**raw_defaults, **pipe}
    for own, other in (("script", "task"), ("task", "script")):
        if own in pipe and other not in pipe:
            merged.pop(other, None)  # a pipeline's own task or script replaces the other from [defaults]
    for table in ("params", "datamodule_params"):  # merged key by key (a trial's datamodule_params.x too)
        defaults_params, own_params = raw_defaults.get(table, {}), pipe.get(table, {})
        merged[table] = {**defaults_params, **own_params} \
            if isinstance(defaults_params, dict) and isinstance(own_params, dict) else own_params
    return merged


def _parse_pipeline(i: int, pipe: Table, raw_defaults: Table, shown: str, base_dir: Path,
                    names: dict[str, int], problems: list[Problem]) -> Pipeline | None:
    """Pipeline `i` validated and resolved, or None; its problems go to `problems`, `names` notes its name."""
    merged = fill_config(_merged(pipe, raw_defaults))
    try:
        model = Pipeline.model_validate(merged, context=merged)
    except ValidationError as exc:
        for p in _problems(exc, shown, RunConfig, ("pipelines", i)):
            key = p.key.split(".", 1)[1] if "." in p.key else ""
            top_key = key.split("[")[0]
            if top_key in raw_defaults and top_key not in pipe and \
                    any(q.key.startswith(f"defaults.{top_key}") for q in problems):
                continue  # reported once, under [defaults]
            problems.append(p)
        _resolve_past(exc, i, pipe, raw_defaults, shown, base_dir, problems)
        return None
    if model.name in names:
        problems.append(Problem(shown, f"pipelines[{i}].name",
                                f"duplicate name {model.name!r} (also pipelines[{names[model.name]}])"))
    names[model.name] = i
    update, found = resolve_kind(model, pipe, i, shown, base_dir)
    update["max_epochs_set"] = "max_epochs" in merged
    trial = pipe.get("trial") or {}  # a table: `model` validated it
    # set for this pipeline (a swept one: sweep.space.KEY)
    for key in set(pipe) - set(trial if isinstance(trial, dict) else ()):
        passed = any(f"{{{key}}}" in str(merged.get(k, "")) for k in FILLED_KEYS)
        why = None if passed else no_effect(model, key, "set")
        if why is not None:
            found.append(Problem(shown, f"pipelines[{i}].{key}", f"has no effect on a {model.kind} pipeline: {why}"))
    problems += [p for p in found if p not in problems]
    if model.datamodule:
        dm_ref, dm_err = resolve_task(model.datamodule, base_dir)
        if dm_err or model.kind != PipelineKind.LIGHTNING:
            where = f"pipelines[{i}].datamodule" if "datamodule" in pipe else "defaults.datamodule"
            problems.append(Problem(shown, where, dm_err or "only Lightning pipelines "
                                    "(task = \"lightning:...\") take a datamodule"))
        update["datamodule"] = dm_ref
    return model.model_copy(update=update)


def _resolve_past(exc: ValidationError, i: int, pipe: Table, raw_defaults: Table, shown: str,
                  base_dir: Path, problems: list[Problem]) -> None:
    """A pipeline with a bad key still has what it runs resolved, so every problem is named at once (a bad name
    and a task that does not exist, say): validated again without its bad keys (a stand-in name for a bad one)."""
    bad = {str(e["loc"][0]) for e in exc.errors() if e.get("loc")}
    if bad & {"task", "script", "validate", "cwd", "datamodule"}:
        return
    merged = {k: v for k, v in fill_config(_merged(pipe, raw_defaults)).items() if k not in bad}
    if "name" in bad:
        merged["name"] = "x"
    try:
        model = Pipeline.model_validate(merged, context=merged)
    except ValidationError:
        return
    problems += [p for p in resolve_kind(model, pipe, i, shown, base_dir)[1] if p not in problems]


def _parse_top(data: Table, shown: str, problems: list[Problem]) -> RunConfig | None:
    """The top-level tables validated (with a stand-in pipeline), or None; problems go to `problems`."""
    rest = {k: v for k, v in data.items() if k not in ("defaults", "pipelines", "sweep")}  # sweep: _sweep_table
    try:
        top = RunConfig.model_validate({**rest, "pipelines": [{"name": "x", "task": "regression"}]})
    except ValidationError as exc:
        problems += _problems(exc, shown, RunConfig)
        return None
    return top


def load_config(path: str | os.PathLike[str]) -> RunConfig:
    """Read and validate a torchherd TOML file."""
    file = str(path)
    shown = display_path(file)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Problem(shown, "", "file not found")]) from None
    except OSError as exc:
        raise ConfigError([Problem(shown, "", f"cannot read: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(shown, "", f"not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}); "
                                   "TOML files are UTF-8")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([Problem(shown, "", f"TOML syntax error: {exc}")]) from None
    return parse_config(data, file, Path(path).resolve().parent)
