"""A task factory's file read with `ast`, never imported: does it parse, and does it define the factory?

`torchherd check` runs this in the supervisor's process, so no user code runs (or
prints); the picker asks again on every highlight, so each file's answer is cached
until it changes.
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import threading
from pathlib import Path

from ...config.problems import display_path
from ...config.schema import BUILTIN_TASKS


def scan_ref(ref: str) -> str:
    """What is wrong with the factory `ref` names ('file.py:build', 'package.module:build'): a file that does
    not parse or does not define it; "" when nothing is, or when only importing it could tell."""
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
