"""The engine runs without the screen: no engine module imports Textual or rich, and importing it loads no torch."""
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
for mod in pkgutil.iter_modules(torchherd.engine.__path__):
    importlib.import_module(f"torchherd.engine.{mod.name}")
print(sorted({"textual", "rich"} & {m.split(".")[0] for m in sys.modules}))
"""


def imported_modules(path: Path) -> set[str]:
    """Every module an engine file names in an import statement, at top level or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against torchherd.engine
                base = ["torchherd", "engine"][: max(0, 3 - node.level)]
                names.add(".".join(base + ([node.module] if node.module else [])))
            else:
                names.add(node.module or "")
    return names


def test_no_engine_file_names_screen_code():
    # Fast and static; the test below proves the same for what the imports pull in, in a fresh interpreter.
    files = sorted(ENGINE.glob("*.py"))
    assert len(files) >= 10, ENGINE
    found = {f"{path.name}: {name}" for path in files for name in imported_modules(path)
             if name.startswith(SCREEN)}
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
