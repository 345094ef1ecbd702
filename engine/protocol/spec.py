"""What a supervised child process runs: the specs a launcher writes and the child reads back.

`WorkerSpec` is one attempt of a pipeline's worker, `ValidatorSpec` the background
validator; `Transport` says how the child reaches its supervisor (pipe descriptors
for a local process, or an address to dial back with a per-attempt token). `write_spec`/`read_spec`
keep the file format in one place.
Standard library only: every child imports this before anything else.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

from .nolinks import open_fd  # standard library only, as this module is

CHILD_MODULE = "torchherd.engine.launch.child"  # `python -P -m` this, with the spec file's path


@dataclass(frozen=True)
class WorkerSpec:
    """One attempt of a pipeline's worker: what to train, where, and from which snapshot number on."""

    role: ClassVar[str] = "worker"
    pipeline: dict[str, Any]  # torchherd.engine.config.schema.Pipeline, dumped as JSON
    validation: dict[str, Any]  # torchherd.engine.config.schema.ValidationConfig, dumped, with the resolved mode
    device: str  # "cpu", or "cuda:N" with N its LOCAL_RANK: its own GPU among those it sees (its gang's; alone, N = 0)
    threads: int  # torch threads for a CPU worker
    pipeline_dir: str
    attempt: int
    snapshot_dir: str = ""  # background validation: where this pipeline's snapshot slots live
    snapshot_seq: int = 0  # the highest snapshot seq handed off so far: seqs never repeat across attempts
    rank: int = 0  # of a gang (torch.distributed's RANK); 0 alone
    world_size: int = 1  # ranks in the gang
    collective_timeout: float = 300.0  # seconds a rank waits in a collective before it gives up
    stop_timeout: float = 120.0  # seconds a graceful stop may take before the supervisor kills the worker
    hold: bool = False  # the run's task check: build, say TaskBuilt, then wait for Proceed before the first step

    @property
    def name(self) -> str:
        return cast(str, self.pipeline["name"])

    @property
    def stem(self) -> str:
        """The spec file's name without its suffix: one per rank."""
        return self.role if self.rank == 0 else f"{self.role}-rank{self.rank}"


@dataclass(frozen=True)
class ValidatorSpec:
    """The background validator: where the snapshots of every pipeline appear, and its device."""

    role: ClassVar[str] = "validator"
    snapshot_root: str
    device: str  # "cpu" or "cuda" (it sees its own GPU only)
    threads: int
    directory: str
    attempt: int
    name: str = "validator"

    @property
    def stem(self) -> str:
        return self.role


ChildSpec = WorkerSpec | ValidatorSpec
_ROLES: dict[str, type] = {WorkerSpec.role: WorkerSpec, ValidatorSpec.role: ValidatorSpec}


@dataclass(frozen=True)
class Transport:
    """How a child reaches its supervisor: a status pipe up, a control pipe down; or, on another machine,
    one TCP connection it dials to `address` and opens with `token` (the supervisor drops any other)."""

    status_fd: int = -1
    control_fd: int = -1
    supervisor_pid: int = 0  # the child dies with this process (on a cluster: the actor that started it)
    address: str = ""  # "host:port" to dial back; "" for the pipes
    token: str = ""  # hex; proves the connection is this attempt's
    extra: dict[str, Any] = field(default_factory=dict)  # anything a launcher adds for its own children


def write_spec(path: Path, spec: ChildSpec, transport: Transport) -> Path:
    """Write the file a child reads at start; returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Private: on a shared filesystem the transport's token must be readable by us alone. Never through a link
    # planted in the run folder: the token would land, and the mode change apply, wherever it points.
    fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fd, 0o600)  # a spec left by an earlier attempt keeps its mode through O_TRUNC
        fh.write(json.dumps({"role": spec.role, "spec": asdict(spec), "transport": asdict(transport)}))
    return path


def read_spec(path: Path) -> tuple[ChildSpec, Transport]:
    """The spec and transport a launcher wrote with `write_spec`."""
    record = json.loads(Path(path).read_text())
    return _ROLES[record["role"]](**record["spec"]), Transport(**record["transport"])
