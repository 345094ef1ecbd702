"""The seam between the app and the engine: `torchherd.engine` names what the app uses, and both kinds of live
run (the supervisor in-process, `RemoteRun` over the socket) offer what `LiveRun` says."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import torchherd.engine as seam
from torchherd.engine.live import LiveRun
from torchherd.engine.serve.remote import RemoteRun
from torchherd.engine.supervise.supervisor import Supervisor


def type_checking_names() -> set[str]:
    """The names engine/__init__.py imports for type checkers."""
    tree = ast.parse(Path(seam.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {alias.asname or alias.name for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}


def test_every_name_of_the_seam_loads_and_type_checkers_see_the_same_names():
    assert type_checking_names() == set(seam._WHERE)
    for name in seam._WHERE:
        assert getattr(seam, name) is not None, name


def protocol_members() -> dict[str, object]:
    return {name: value for name, value in vars(LiveRun).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def test_the_protocol_names_what_the_app_uses_of_a_run():
    assert {"alive", "subscribe", "kill", "restart", "pause", "unpause", "stop", "checkpoint", "stacks", "promote",
            "shutdown", "wait"} == set(protocol_members())
    assert "run_dir" in LiveRun.__annotations__


def mismatches(cls: type) -> list[str]:
    """How `cls` falls short of LiveRun: a member missing, or one of another shape (async-ness, parameters)."""
    out = []
    for name, member in protocol_members().items():
        theirs = inspect.getattr_static(cls, name, None)
        if theirs is None:
            out.append(f"lacks {name}")
        elif isinstance(member, property) != isinstance(theirs, property):
            out.append(f"{name}: property or not")
        elif not isinstance(member, property):
            if inspect.iscoroutinefunction(theirs) != inspect.iscoroutinefunction(member):
                out.append(f"{name}: async or not")
            wanted, given = inspect.signature(member).parameters, inspect.signature(theirs).parameters
            out += [f"{name}: {p.name} missing or of another kind or default" for p in wanted.values()
                    if p.name not in given or (given[p.name].kind, given[p.name].default) != (p.kind, p.default)]
            out += [f"{name}: {p.name} has no default" for p in given.values()
                    if p.name not in wanted and p.default is inspect.Parameter.empty]
    if "self.run_dir =" not in inspect.getsource(cls):
        out.append("sets no run_dir")
    return out


@pytest.mark.parametrize("cls", [Supervisor, RemoteRun], ids=["Supervisor", "RemoteRun"])
def test_both_kinds_of_live_run_offer_every_member_in_the_same_shape(cls):
    assert mismatches(cls) == []


def test_the_shape_check_sees_what_falls_short():
    class Short:
        run_dir: Path

        def stop(self, name: str | None = None, force: bool = True) -> None: ...

        def kill(self, name: str, now: bool) -> None: ...

        async def pause(self, name: str) -> None: ...

    found = mismatches(Short)
    assert {"lacks wait", "stop: reason missing or of another kind or default", "kill: now has no default",
            "pause: async or not", "sets no run_dir"} <= set(found)
