"""Placeholders in a script pipeline's `args`, `resume_args` and `cwd`.

Two kinds, read left to right as str.format would ({{ and }} are braces, {name} a placeholder):
- the config's own values, filled in by the loader for each pipeline: `{params.NAME}` (a key of the
  pipeline's params, swept or set) and `{KEY}` for a pipeline key its sweep varies (`{batch_size}`);
- the attempt's, filled in when it starts (engine/runners/script/arguments.py): `{checkpoint_dir}`,
  `{pipeline_dir}`, `{run_dir}`, `{rank}`, `{world_size}`, `{restart}` (`args` and `resume_args` only).
Anything else is a config error naming the argument.
"""
from __future__ import annotations

import difflib
import re
from typing import cast

from .values import Table, TomlValue

PLACEHOLDER = r"\{\{|\}\}|\{([A-Za-z_][\w.]*)\}"
PLACEHOLDERS = ("checkpoint_dir", "pipeline_dir", "run_dir", "rank", "world_size", "restart")
FILLED_KEYS = ("args", "resume_args", "cwd")  # the keys whose config placeholders the loader fills in


def _text(value: TomlValue | None) -> str:
    """A config value as an argument: TOML's true/false, the number or string as written; braces kept literal
    for the attempt's own filling."""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return text.replace("{", "{{").replace("}", "}}")


def config_values(table: Table) -> dict[str, str]:
    """What a pipeline's table (over [defaults], with its trial's values) fills in: `params.NAME` for each of
    its params, and each key its trial sets."""
    params = table.get("params")
    values = {f"params.{k}": _text(v) for k, v in (params.items() if isinstance(params, dict) else ())}
    trial = table.get("trial")
    values.update({k: _text(v) for k, v in (trial.items() if isinstance(trial, dict) else ())
                   if not k.startswith("params.")})
    return values


def fill_config(table: Table) -> Table:
    """`table` with `{params.NAME}` and swept keys filled in in `args`, `resume_args` and `cwd`; placeholders
    it has no value for are left for the schema to refuse (see `unknown`)."""
    values = config_values(table)

    def fill(arg: str) -> str:
        return re.sub(PLACEHOLDER, lambda m: values.get(m[1], m[0]) if m[1] else m[0], arg)

    out = dict(table)
    for key in ("args", "resume_args"):
        arguments = out.get(key)
        if isinstance(arguments, list):
            out[key] = [fill(a) if isinstance(a, str) else a for a in arguments]
    cwd = out.get("cwd")
    if isinstance(cwd, str):
        out["cwd"] = fill(cwd).replace("{{", "{").replace("}}", "}")
    return out


def unknown(arg: str, runtime: bool, loaded: Table | None) -> str | None:
    """What is wrong with `arg`'s placeholders, or None. `runtime`: the attempt's placeholders may appear (args,
    resume_args; not cwd). `loaded`: the validation context of a pipeline the loader filled in (its params and
    trial), where anything left is unfillable; None for [defaults] alone, where config placeholders wait."""
    for name in re.findall(PLACEHOLDER, arg):
        if not name or (runtime and name in PLACEHOLDERS):
            continue
        if loaded is None and (name.startswith("params.") or name in SETTING_NAMES):
            continue  # [defaults]: filled in per pipeline
        return _why(arg, name, runtime, loaded or {})
    return None


SETTING_NAMES: set[str] = set()  # the pipeline keys a sweep may vary (set by schema.py, which defines them)


def _table(value: object) -> Table:
    """`value` if it is a table, else an empty one: the schema reports a `params = 5` itself."""
    return cast(Table, value) if isinstance(value, dict) else {}


def _why(arg: str, name: str, runtime: bool, loaded: Table) -> str:
    # `params` and `trial` as written, taken for tables (the schema checks them separately)
    params = _table(loaded.get("params"))
    trial = _table(loaded.get("trial"))
    head = f"{arg!r}: {{{name}}} is never filled in"
    if name.startswith("params."):
        return f"{head}: this pipeline's params have no {name[len('params.'):]!r} (it has " \
               f"{', '.join(sorted(params)) or 'none'}; set it in params or sweep it as sweep.space.{name})"
    if name in SETTING_NAMES:
        return f"{head}: {name} is not a key this pipeline's sweep varies (add sweep.space.{name}, or write " \
               f"its value)"
    known = [f"params.{k}" for k in params] + [k for k in trial if not k.startswith("params.")]
    known += list(PLACEHOLDERS) if runtime else []
    close = difflib.get_close_matches(name, known, n=1) or \
        [k for k in known if k.rsplit(".", 1)[-1] == name][:1]
    hint = f"; did you mean {{{close[0]}}}?" if close else ""
    offered = (", ".join(f"{{{p}}}" for p in PLACEHOLDERS) + ", " if runtime else "")
    return (f"{arg!r}: unknown placeholder {{{name}}}; torchherd fills in {offered}{{params.NAME}} for a key of "
            f"the pipeline's params and {{KEY}} for a key its sweep varies (write {{{{{name}}}}} for literal "
            f"braces){hint}")
