"""torchherd: supervise PyTorch training from a terminal.

What a task file needs is importable from here (`from torchherd import Task`);
importing it loads neither torch nor Textual. The engine is `torchherd.engine`,
the app and command line `torchherd.tui`.
"""
from torchherd.engine.task import Task

__all__ = ["Task"]
__version__ = "0.1.0"
