"""torchherd: supervise PyTorch training from a terminal.

What a task file needs is importable from here (`from torchherd import Task`,
`from torchherd import LightningTask`); importing it loads neither torch,
Lightning nor Textual. The engine is `torchherd.engine`,
the app and command line `torchherd.tui`.
"""
from torchherd.engine.runners.task.api import Task

__all__ = ["Task", "LightningTask"]


def __getattr__(name: str):
    # Loaded on first use, so `import torchherd` stays cheap for people without Lightning.
    if name == "LightningTask":
        from torchherd.engine.runners.lightning.support import LightningTask

        return LightningTask
    raise AttributeError(f"module 'torchherd' has no attribute {name!r}")
__version__ = "0.1.0"
