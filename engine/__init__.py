"""torchherd's engine, and the seam the app and the command line use it through: every name they need, here.

`from torchherd.engine import load_config, RemoteRun` loads each name's module on first use, so a worker
child or the app importing one name pays for no other, and none loads torch or Textual. Outside the engine,
only this module and `engine.protocol` (the event and command types) are imported (tests/test_boundary.py);
`LiveRun` is what a live run offers, in-process or over its socket.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

_WHERE = {  # name -> the module that defines it
    # configs: read, checked, labelled
    "ConfigError": ".config.problems", "Problem": ".config.problems",
    "RunConfig": ".config.schema", "load_config": ".config.load", "labelled": ".config.labels",
    "reports_validation": ".config.validated", "TRAIN_LOSS": ".config.validated",
    "TRAIN_LOSS_SAID": ".config.validated", "TO_VALIDATE": ".config.validated",
    "CheckReport": ".preflight.check", "check_config": ".preflight.check",
    "ProbeCancelled": ".preflight.probe", "pending_jobs": ".preflight.probe", "plan_jobs": ".preflight.probe",
    "probe_tasks": ".preflight.probe",
    # run directories: what a run left, live or ended
    "checkpoint_bytes": ".rundir.directory",
    "RunSummary": ".rundir.directory", "list_runs": ".rundir.directory", "load_resolved_configs": ".rundir.directory",
    "read_events": ".rundir.directory", "run_held": ".rundir.directory", "summarize": ".rundir.directory",
    "read_history": ".rundir.history", "export_run": ".rundir.tensorboard", "Unreadable": ".rundir.lines",
    "encode_line": ".rundir.lines",
    "export_schedules": ".supervise.sweep.exploiting",
    # live runs: started as a service, found, reached
    "LiveRun": ".live", "EventStream": ".supervise.bus",
    "Supervisor": ".supervise.supervisor", "PipelineView": ".supervise.supervisor",
    "ServiceFailed": ".serve.service", "StartCancelled": ".serve.service", "spawn": ".serve.service",
    "NotLive": ".serve.remote", "RemoteRun": ".serve.remote",
    "MetricsServer": ".serve.exporter",
    "clean_stale": ".serve.runtime", "live_runs": ".serve.runtime", "read_control": ".serve.runtime",
    "Ledger": ".hardware.ledger",
    # what training code and scripts use
    "Task": ".runners.task.api", "uses_client": ".runners.script",
    "Event": ".protocol.messages", "WorkerState": ".protocol.states",
}

__all__ = sorted(_WHERE)

if TYPE_CHECKING:  # the same names, for type checkers and readers (kept equal to _WHERE by tests/test_seam.py)
    from .config.labels import labelled as labelled
    from .config.load import load_config as load_config
    from .config.problems import ConfigError as ConfigError
    from .config.problems import Problem as Problem
    from .config.schema import RunConfig as RunConfig
    from .config.validated import TO_VALIDATE as TO_VALIDATE
    from .config.validated import TRAIN_LOSS as TRAIN_LOSS
    from .config.validated import TRAIN_LOSS_SAID as TRAIN_LOSS_SAID
    from .config.validated import reports_validation as reports_validation
    from .hardware.ledger import Ledger as Ledger
    from .live import LiveRun as LiveRun
    from .preflight.check import CheckReport as CheckReport
    from .preflight.check import check_config as check_config
    from .preflight.probe import ProbeCancelled as ProbeCancelled
    from .preflight.probe import pending_jobs as pending_jobs
    from .preflight.probe import plan_jobs as plan_jobs
    from .preflight.probe import probe_tasks as probe_tasks
    from .protocol.messages import Event as Event
    from .protocol.states import WorkerState as WorkerState
    from .rundir.directory import RunSummary as RunSummary
    from .rundir.directory import checkpoint_bytes as checkpoint_bytes
    from .rundir.directory import list_runs as list_runs
    from .rundir.directory import load_resolved_configs as load_resolved_configs
    from .rundir.directory import read_events as read_events
    from .rundir.directory import run_held as run_held
    from .rundir.directory import summarize as summarize
    from .rundir.history import read_history as read_history
    from .rundir.lines import Unreadable as Unreadable
    from .rundir.lines import encode_line as encode_line
    from .rundir.tensorboard import export_run as export_run
    from .runners.script import uses_client as uses_client
    from .runners.task.api import Task as Task
    from .serve.exporter import MetricsServer as MetricsServer
    from .serve.remote import NotLive as NotLive
    from .serve.remote import RemoteRun as RemoteRun
    from .serve.runtime import clean_stale as clean_stale
    from .serve.runtime import live_runs as live_runs
    from .serve.runtime import read_control as read_control
    from .serve.service import ServiceFailed as ServiceFailed
    from .serve.service import StartCancelled as StartCancelled
    from .serve.service import spawn as spawn
    from .supervise.bus import EventStream as EventStream
    from .supervise.supervisor import PipelineView as PipelineView
    from .supervise.supervisor import Supervisor as Supervisor
    from .supervise.sweep.exploiting import export_schedules as export_schedules


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name], __name__), name)
    globals()[name] = value  # once: the next look-up is a plain attribute
    return value
