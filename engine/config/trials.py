"""Expanding a `[sweep]` table into trials: every grid point times `samples` seeded draws, each one a set of
values for pipeline keys and `params.*`, checked key by key and named from its values.

`expand_pipelines` turns each `[[pipelines]]` table into one table per trial, ready for the loader.
"""
from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, cast

from pydantic import ValidationError

from .labels import list_parts as _list_parts
from .labels import short as _short
from .placeholders import _text
from .problems import Problem
from .schema import Pipeline, PipelineSettings
from .sweep import RANGE_KINDS, SweepConfig
from .values import Table, TomlValue

NOT_SWEPT = ("params", "task", "script", "name", "datamodule_params")  # what a trial cannot vary as a whole
NESTED = ("params", "datamodule_params")  # tables whose keys a trial varies one by one: `params.lr`
NAME_LIMIT = 64  # pipeline names name folders (schema.NAME_PATTERN)


V = TypeVar("V")  # a table's values: those of the tables nested in it too (TOML's)


def flat_space(space: dict[str, V]) -> dict[str, V]:
    """`space` with TOML's nesting undone: `params.lr = [...]` arrives as {"params": {"lr": [...]}} (so does
    `datamodule_params.batch_size`)."""
    out: dict[str, V] = {}
    for key, value in space.items():
        if key in NESTED and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def space_problems(sweep: SweepConfig, file: str) -> list[Problem]:
    """What is wrong with each key of the search space, named `sweep.space.KEY`."""
    problems = []
    fields = [n for n in PipelineSettings.model_fields if n not in NOT_SWEPT]
    space = flat_space(sweep.space)
    if not space:
        return [Problem(file, "sweep.space", "is empty: name a key to search, e.g. params.lr = [0.1, 0.01]")]
    for key, spec in space.items():
        where = f"sweep.space.{key}"
        if key.split(".", 1)[0] not in NESTED and key not in fields:
            from difflib import get_close_matches
            close = get_close_matches(key, fields, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            problems.append(Problem(file, where, f"unknown key ({hint}task parameters are params.NAME)"))
            continue
        for message in _spec_problems(key, spec):
            problems.append(Problem(file, where, message))
    if "mode" in sweep.model_fields_set and sweep.scheduler != "asha":
        problems.append(Problem(file, "sweep.mode", f"is {sweep.mode!r}, but only ASHA stops or promotes: set "
                                f"scheduler = \"asha\" (it is {sweep.scheduler!r}) or leave mode out"))
    problems += _pbt_problems(sweep, space, file)
    if sweep.samples > 1 and not any(isinstance(s, dict) for s in space.values()):
        problems.append(Problem(file, "sweep.samples", f"is {sweep.samples}, but no key is sampled: give one a "
                                "table such as {log_uniform = [1e-4, 1e-1]}, or leave samples at 1"))
    return problems


def _pbt_problems(sweep: SweepConfig, space: Table, file: str) -> list[Problem]:
    """PBT's keys: set only with scheduler = "pbt"; `explore` names swept keys, 'perturb' numeric ones, 'keep'
    any."""
    problems = []
    for key in ("perturbation_interval", "quantile_fraction", "explore"):
        if key in sweep.model_fields_set and sweep.scheduler != "pbt":
            problems.append(Problem(file, f"sweep.{key}", f"is set, but only PBT uses it: set scheduler = \"pbt\" "
                                    f"(it is {sweep.scheduler!r}) or leave it out"))
    for key, how in flat_space(sweep.explore).items():
        if how not in ("perturb", "resample", "keep"):
            problems.append(Problem(file, f"sweep.explore.{key}", f"must be 'perturb', 'resample' or 'keep' (got "
                                    f"{how!r})"))
        elif key not in space:
            problems.append(Problem(file, f"sweep.explore.{key}", f"is not a swept key (sweep.space has "
                                    f"{', '.join(space) or 'none'})"))
        elif how == "perturb" and not all(numeric(v) for v in space_values(space[key])):
            problems.append(Problem(file, f"sweep.explore.{key}", "is 'perturb', but the key's values are not all "
                                    "numbers: use 'resample'"))
    return problems


def numeric(value: object) -> bool:
    """A number PBT can perturb (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def space_values(spec: TomlValue) -> list[TomlValue]:
    """The values a key's spec names: its list, its choices, or its range's ends."""
    if isinstance(spec, list):
        return spec
    # A range's ends or a choice's list; not checked here (space_problems says what is wrong with it).
    inner = next(iter(spec.values())) if isinstance(spec, dict) and spec else []
    return list(cast("Iterable[TomlValue]", inner)) if isinstance(inner, list) else []


def draw(rng: random.Random, spec: list[TomlValue] | Table) -> TomlValue:
    """One value of a key's spec: from its list (a grid axis) or a draw from its table."""
    return rng.choice(spec) if isinstance(spec, list) else _draw(rng, spec)


def _spec_problems(key: str, spec: TomlValue) -> list[str]:
    if isinstance(spec, list):
        if not spec:
            return ["an empty list: give the values to try"]
        return [m for v in spec for m in _value_problems(key, v)]
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in RANGE_KINDS:
        return [f"must be a list of values (a grid) or a table with one of {', '.join(RANGE_KINDS)} "
                f"(got {spec!r})"]
    kind, bounds = next(iter(spec.items()))
    if kind == "choice":
        return _spec_problems(key, bounds) if isinstance(bounds, list) else [f"choice must be a list (got {bounds!r})"]
    numbers = isinstance(bounds, list) and len(bounds) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
    if not numbers:
        return [f"{kind} must be [low, high] with low <= high (got {bounds!r})"]
    low_high = cast("list[float]", bounds)  # two numbers: checked just above
    if low_high[0] > low_high[1]:
        return [f"{kind} must be [low, high] with low <= high (got {bounds!r})"]
    if kind == "log_uniform" and low_high[0] <= 0:
        return [f"log_uniform needs low > 0 (got {bounds!r})"]
    if kind == "int_uniform" and not all(isinstance(b, int) for b in low_high):
        return [f"int_uniform needs whole numbers (got {bounds!r})"]
    return [m for v in low_high for m in _value_problems(key, int(v) if kind == "int_uniform" else v)]


def _value_problems(key: str, value: TomlValue) -> list[str]:
    """Whether `value` is one the pipeline key takes (task parameters take anything TOML can say)."""
    if key.split(".", 1)[0] in NESTED:
        return []
    try:
        PipelineSettings.model_validate({key: value})
    except ValidationError as exc:
        msg = exc.errors()[0].get("msg", "invalid").removeprefix("Value error, ")
        return [f"{value!r}: {msg}"]
    return []


def trials(sweep: SweepConfig) -> list[Table]:
    """Every trial's values by key, grid points in the order written, `samples` seeded draws at each."""
    space = flat_space(sweep.space)
    grid = {k: v for k, v in space.items() if isinstance(v, list)}
    sampled = {k: v for k, v in space.items() if isinstance(v, dict)}
    rng = random.Random(sweep.seed)
    out = []
    for point in itertools.product(*grid.values()):
        for _ in range(sweep.samples):
            values = dict(zip(grid, point))
            values.update({k: _draw(rng, spec) for k, spec in sampled.items()})
            out.append({k: values[k] for k in space})  # the order the keys were written in
    return out


def _draw(rng: random.Random, spec: Table) -> TomlValue:
    kind, bounds = next(iter(spec.items()))
    if kind == "choice":
        return rng.choice(cast("list[TomlValue]", bounds))  # space_problems checked: a list
    low_high = cast("list[float]", bounds)  # space_problems checked: [low, high], numbers
    if kind == "int_uniform":
        return rng.randint(int(low_high[0]), int(low_high[1]))
    if kind == "log_uniform":
        return math.exp(rng.uniform(math.log(low_high[0]), math.log(low_high[1])))
    return rng.uniform(low_high[0], low_high[1])


def retuned(pipe: Pipeline, values: Table) -> Pipeline:
    """Pipeline `pipe` (a trial) with other values for its swept keys (PBT explored them): the keys and `trial`
    set, and a script's arguments that carried an old value (`{KEY}` filled in: "0.01", "--lr=0.01") the new."""
    update: dict[str, Any] = {"trial": {**pipe.trial, **values}}
    args, resume_args = list(pipe.args), list(pipe.resume_args)
    for key, value in values.items():
        nest, _, sub = key.partition(".")
        if sub and nest in NESTED:
            update[nest] = {**update.get(nest, getattr(pipe, nest)), sub: value}
        else:
            update[key] = value
        old, new = _text(pipe.trial.get(key)), _text(value)
        for arguments in (args, resume_args):
            arguments[:] = [new if a == old else a[:-len(old)] + new if a.endswith(f"={old}") else a for a in arguments]
    return pipe.model_copy(update={**update, "args": args, "resume_args": resume_args})


def trial_name(base: str, values: Table, others: Sequence[Table] = ()) -> str:
    """`base` and each value with its key's last part: 'mlp-lr0.01-batch_size32'. A list (a swept `args`) is
    named by what differs from the `others` trials, each argument after its flag: 'mlp-lr0.05'."""
    parts = [base]
    for key, v in values.items():
        if isinstance(v, list):
            parts += _list_parts(v, [o.get(key) for o in others])
        else:
            parts.append(f"{key.rsplit('.', 1)[-1]}{_short(v)}")
    return "-".join(parts)


def expand_pipelines(raw: list[Table], sweep: SweepConfig) -> list[Table]:
    """Each pipeline table once per trial: its values set (a `params.*` key over the pipeline's own params),
    named from them (unique, within the 64 characters a name may have) and noted in `trial`."""
    out, names = [], set()
    all_trials = trials(sweep)
    for pipe in raw:
        base = str(pipe.get("name", "trial"))
        for i, values in enumerate(all_trials):
            # `params` as written: a table, or left as it is for the schema to refuse (`params = 5`)
            params = pipe.get("params")
            table = {**pipe, "params": dict(params) if isinstance(params, dict) else params or {}}
            for key, value in values.items():
                nest, _, sub = key.partition(".")
                if sub and nest in NESTED:
                    within = table.get(nest)
                    if within is not None and not isinstance(within, dict):
                        continue  # `params = 5`: the schema refuses it, naming the key
                    table[nest] = {**cast(Table, within or {}), sub: value}
                else:
                    table[key] = value
            name = trial_name(base, values, all_trials)
            if len(name) > NAME_LIMIT or name in names:
                name = f"{name[:NAME_LIMIT - 6]}-t{i}"
            names.add(name)
            table["name"] = name
            table["trial"] = values
            out.append(table)
    return out
