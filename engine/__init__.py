"""torchherd's engine: configs, supervised training processes and their events; no UI code.

Import what you need from here (`from torchherd.engine import Supervisor`); each name loads its module on
first use, so a worker child or the app importing one sub-package pays for no other, and none loads
torch or Textual.
"""
from importlib import import_module

_WHERE = {  # name -> the module that defines it
    "CheckReport": ".preflight.check", "check_config": ".preflight.check",
    "load_config": ".config.load",
    "ConfigError": ".config.problems", "Problem": ".config.problems",
    "RunConfig": ".config.schema",
    "Event": ".protocol.messages",
    "WorkerState": ".protocol.states",
    "PipelineView": ".supervise.supervisor", "Supervisor": ".supervise.supervisor",
    "Task": ".runners.task.api",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name], __name__), name)
    globals()[name] = value  # once: the next look-up is a plain attribute
    return value
