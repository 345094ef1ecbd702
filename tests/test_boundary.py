"""The engine runs without the screen: no engine module imports Textual or rich, and importing it loads no torch."""
import subprocess
import sys

CODE = """
import importlib, pkgutil, sys
import torchherd.engine
for mod in pkgutil.iter_modules(torchherd.engine.__path__):
    importlib.import_module(f"torchherd.engine.{mod.name}")
print(sorted({"textual", "rich"} & {m.split(".")[0] for m in sys.modules}))
"""


def test_no_engine_module_imports_screen_code():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_importing_torchherd_does_not_load_torch():
    # The app imports the engine at start-up; torch (seconds to import) belongs in the workers.
    code = "import sys, torchherd, torchherd.engine; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
