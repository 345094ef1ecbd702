"""The engine runs without the screen: no engine module imports Textual or rich."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CODE = """
import importlib, pkgutil, sys
import engine
for mod in pkgutil.iter_modules(engine.__path__):
    importlib.import_module(f"engine.{mod.name}")
print(sorted({"textual", "rich"} & {m.split(".")[0] for m in sys.modules}))
"""


def test_no_engine_module_imports_screen_code():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True,
                         env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


def test_importing_engine_does_not_load_torch():
    # The app imports engine at start-up; torch (seconds to import) belongs in the workers.
    code = "import sys, engine; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "False"
