"""torchherd's engine: configs, supervised training processes and their events; no UI code.

Import what you need from here; importing it loads neither torch nor Textual.
"""
from .preflight.check import CheckReport, check_config
from .config.load import load_config
from .config.problems import ConfigError, Problem
from .config.schema import RunConfig
from .protocol.messages import Event
from .protocol.states import WorkerState
from .supervise.supervisor import PipelineView, Supervisor
from .runners.task.api import Task

__all__ = ["CheckReport", "ConfigError", "Event", "PipelineView", "Problem", "RunConfig", "Supervisor", "Task",
           "WorkerState", "check_config", "load_config"]
