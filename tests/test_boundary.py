"""The engine runs without the screen, and its sub-packages form layers.

No engine module imports Textual or rich, importing it loads no torch, and no two
engine sub-packages import each other (directly or round a longer loop).
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import torchherd.engine

SCREEN = ("textual", "rich", "torchherd.tui")
ENGINE = Path(torchherd.engine.__path__[0])

CODE = """
import importlib, pkgutil, sys
import torchherd.engine
for mod in pkgutil.walk_packages(torchherd.engine.__path__, "torchherd.engine."):
    importlib.import_module(mod.name)
print(sorted({"textual", "rich"} & {m.split(".")[0] for m in sys.modules}))
"""


def module_name(path: Path) -> list[str]:
    """`engine/launch/ray/actor.py` -> ["torchherd", "engine", "launch", "ray", "actor"]."""
    parts = list(path.relative_to(ENGINE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] + ["__init__"]
    return ["torchherd", "engine", *parts]


def imported_modules(path: Path) -> set[str]:
    """Every module an engine file names in an import statement, at top level or inside a function."""
    return imported_modules_of(path, module_name(path)[:-1])


def imported_modules_of(path: Path, package: list[str]) -> set[str]:
    """Every module a file of `package` names in an import statement, at top level, inside a function or for
    type checkers."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's own package
                base = package[: len(package) - node.level + 1]
                if node.module:
                    names.add(".".join(base + [node.module]))
                else:  # `from . import messages`: each name may be a module
                    names.update(".".join(base + [alias.name]) for alias in node.names)
            else:
                names.add(node.module or "")
    return names


def engine_files() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


# The static check that no engine module imports screen code is ruff's (TID251 in pyproject.toml, run by
# scripts/lint.sh); the test below proves the same for what the imports pull in, in a fresh interpreter.


def subpackage_graph() -> dict[str, set[str]]:
    """Which engine sub-package imports which (the top-level `torchherd.engine` facade left out)."""
    graph: dict[str, set[str]] = {}
    for path in engine_files():
        own = module_name(path)
        if len(own) < 4:  # engine/__init__.py: the public facade, above every layer
            continue
        edges = graph.setdefault(own[2], set())
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[:2] == ["torchherd", "engine"] and len(parts) > 2 and parts[2] != own[2]:
                edges.add(parts[2])
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One import loop between sub-packages, as a path that ends where it began, or []."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return []
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return []

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return []


def test_engine_subpackages_import_each_other_without_loops():
    graph = subpackage_graph()
    assert {"protocol", "launch", "supervise", "worker", "runners", "validation"} <= set(graph)
    assert cycle_in(graph) == []


# The engine's sub-packages from the ground up: each imports only those below it (docs/develop/architecture.md).
# The device layer asks no runner: what a pipeline's runner can run as a gang is preflight's question
# (preflight/plan.py), and a runner never asks where it runs (its environment says).
LAYERS = ["protocol", "config", "worker", "rundir", "hardware", "runners", "validation", "telemetry", "launch",
          "preflight", "sinks", "supervise", "serve"]


def test_engine_subpackages_import_only_the_layers_below():
    graph = subpackage_graph()
    assert set(graph) <= set(LAYERS), f"place the new sub-package in LAYERS: {set(graph) - set(LAYERS)}"
    upward = {f"{a} -> {b}" for a, targets in graph.items() for b in targets if LAYERS.index(b) > LAYERS.index(a)}
    assert upward == set()


def test_the_loop_finder_finds_a_loop():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) == []


def test_protocol_needs_only_the_standard_library():
    # Every child imports it before anything else, and a client of the run may have no torch.
    third_party = {"torch", "pydantic", "psutil", "pynvml", "ray", "lightning", "numpy", "textual", "rich"}
    found = {f"{path.name}: {name}" for path in (ENGINE / "protocol").glob("*.py")
             for name in imported_modules(path)
             if name.split(".")[0] in third_party
             or (name.startswith("torchherd.") and not name.startswith("torchherd.engine.protocol"))}
    assert found == set()


@pytest.mark.slow  # imports every engine module, torch among them: seconds
def test_no_engine_module_imports_screen_code():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_importing_torchherd_does_not_load_torch():
    # The app imports the engine at start-up; torch (seconds to import) belongs in the workers.
    code = "import sys, torchherd, torchherd.engine; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def tui_root() -> Path:
    import torchherd.tui
    return Path(torchherd.tui.__path__[0])


def engine_imports_past_the_seam(path: Path, root: Path) -> set[str]:
    """The engine modules a tui/ file imports other than the seam (`torchherd.engine`) and `engine.protocol`."""
    package = ["torchherd", "tui", *path.relative_to(root).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names = [".".join(base + ([node.module] if node.module else []))]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(n for n in names if n.startswith("torchherd.engine.")
                     and not n.startswith("torchherd.engine.protocol"))
    return found


def test_the_app_reaches_the_engine_through_the_seam_alone():
    """tui/ imports `torchherd.engine` (engine/__init__.py: the seam) and `engine.protocol` (the event types), nothing
    deeper: what the app needs of the engine is written down in one module."""
    root = tui_root()
    files = sorted(root.rglob("*.py"))
    assert len(files) >= 20
    found = {f"{p.relative_to(root)}: {name}" for p in files for name in engine_imports_past_the_seam(p, root)}
    assert found == set()


def test_the_seam_check_sees_an_import_past_it(tmp_path):
    widget = tmp_path / "widgets" / "x.py"
    widget.parent.mkdir()
    widget.write_text("from ...engine.serve.remote import RemoteRun\nfrom ...engine import RemoteRun\n"
                      "from ...engine.protocol.states import WorkerState\nimport torchherd.engine.rundir.history\n")
    assert engine_imports_past_the_seam(widget, tmp_path) == {"torchherd.engine.serve.remote",
                                                              "torchherd.engine.rundir.history"}


def test_no_function_grows_past_60_lines():
    """A function past 60 lines is two functions, and the second one deserves a name."""
    import torchherd.tui
    tree = [*ENGINE.rglob("*.py"), *Path(torchherd.tui.__path__[0]).rglob("*.py"),
            *Path(torchherd.__path__[0]).glob("*.py")]
    long = {f"{p.name}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
            for p in tree for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60}
    assert not long, f"split these: {long}"


def test_the_client_wire_format_needs_only_the_standard_library():
    # torchherd/client_frames.py and client_env.py run inside users' scripts and the engine's script runner
    # speaks them: a leaf both sides import, so the public package and the engine never import in a circle.
    found = {f"{name}: {imp}" for name in ("client_frames.py", "client_env.py")
             for imp in imported_modules_of(Path(torchherd.__path__[0]) / name, ["torchherd"])
             if imp.split(".")[0] in ("torch", "pydantic", "msgspec", "numpy")
             or (imp.startswith("torchherd") and not imp.startswith("torchherd.client_"))}
    assert found == set()


def module_graph() -> dict[str, set[str]]:
    """Which torchherd module imports which (engine, tui, the public package), imports for type checkers too."""
    import torchherd.tui
    roots = {"torchherd.engine": ENGINE, "torchherd.tui": Path(torchherd.tui.__path__[0])}
    files = {f"{pkg}.{'.'.join(p.relative_to(root).with_suffix('').parts)}": p
             for pkg, root in roots.items() for p in root.rglob("*.py")}
    files.update({f"torchherd.{p.stem}": p for p in Path(torchherd.__path__[0]).glob("*.py")})
    files = {name.removesuffix(".__init__"): p for name, p in files.items()}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for imported in imported_modules_of(path, package):
            while imported and imported not in files:
                imported = imported.rpartition(".")[0]
            related = imported.startswith(name + ".") or name.startswith(imported + ".")  # a package and its own
            if imported and imported != name and not related:
                graph.setdefault(name, set()).add(imported)
    return graph


def test_no_module_imports_itself_round_a_loop():
    """No two torchherd modules import each other, directly or round a longer loop (lazy imports and imports for
    type checkers count: a loop of types is a loop a reader follows too)."""
    graph = module_graph()
    assert {"torchherd.tui.attach", "torchherd.engine.worker.snapshot", "torchherd.client"} <= set(graph)
    assert cycle_in(graph) == []


POLICIES = [*(ENGINE / "supervise" / "sweep").glob("*.py"), *(ENGINE / "supervise" / "health").glob("*.py")]
# (they read a SessionView and send decisions: engine/supervise/decisions.py)


def test_no_policy_imports_or_names_the_supervisor():
    assert len(POLICIES) >= 9
    for path in POLICIES:
        tree = ast.parse(path.read_text())
        modules = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert not {m for m in modules if m.endswith("supervisor")} and "Supervisor" not in names, path


def test_no_module_reads_a_reason_or_a_notice_by_its_first_words():
    # A condition the engine or the app acts on is a state or a typed field; only the reader of older records
    # (engine/protocol/old_records.py) knows the words older versions began reasons with.
    import torchherd.tui
    found = []
    for path in [*ENGINE.rglob("*.py"), *Path(torchherd.tui.__path__[0]).rglob("*.py")]:
        if path.name == "old_records.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("startswith", "endswith", "removeprefix"):
                receiver = ast.unparse(node.func.value)
                if any(word in receiver for word in ("reason", ".text", "notice")) and "reply" not in receiver:
                    found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert not found, found


def test_the_supervisors_record_of_a_pipeline_is_not_called_a_run():
    # The glossary: "run" is what a run id names, never one pipeline (docs/develop/architecture.md).
    found = []
    for path in (ENGINE / "supervise").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.arg) and node.annotation is not None and \
                    "SupervisedPipeline" in ast.unparse(node.annotation) and node.arg in ("run", "runs"):
                found.append(f"{path.name}:{node.lineno} {node.arg}")
            if isinstance(node, ast.ClassDef) and node.name == "PipelineRun":
                found.append(f"{path.name}:{node.lineno} class {node.name}")
    assert not found, found
