"""torchherd: supervise PyTorch training from a terminal.

What a task file needs is importable from here (`from torchherd import Task`,
`from torchherd import LightningTask`); importing it loads neither torch,
Lightning, pydantic nor Textual. The engine is `torchherd.engine`,
the app and command line `torchherd.tui`.
"""

__all__ = ["LightningTask", "Task"]
__version__ = "0.1.0"

TYPE_CHECKING = False  # typing is not loaded for type checkers alone
if TYPE_CHECKING:  # what `__getattr__` loads, for type checkers and readers
    from torchherd.engine.runners.lightning.support import LightningTask as LightningTask
    from torchherd.engine.runners.task.api import Task as Task


def __getattr__(name: str) -> object:
    # Loaded on first use: `import torchherd.client` runs this file inside users' training scripts,
    # and the engine behind Task (pydantic, the supervisor) is no cost of theirs.
    if name == "Task":
        from torchherd.engine.runners.task.api import Task

        return Task
    if name == "LightningTask":
        from torchherd.engine.runners.lightning.support import LightningTask

        return LightningTask
    raise AttributeError(f"module 'torchherd' has no attribute {name!r}")
