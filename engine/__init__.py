"""torchherd's engine: configs, supervised training processes and their events; no UI code.

Import what you need from here; importing it loads neither torch nor Textual.
"""
from torchherd.engine.check import CheckReport, check_config
from torchherd.engine.config import ConfigError, Problem, RunConfig, load_config
from torchherd.engine.messages import Event
from torchherd.engine.states import WorkerState
from torchherd.engine.supervisor import PipelineView, Supervisor
from torchherd.engine.task import Task

__all__ = ["CheckReport", "ConfigError", "Event", "PipelineView", "Problem", "RunConfig", "Supervisor", "Task",
           "WorkerState", "check_config", "load_config"]
