"""The backend contract: `Backend` (what starts a session's attempts, and where), `Handle` (one running
attempt as the supervisor sees it) and `LaunchSpec` (what to start).

Every ability beyond `launch` is a method with a documented default that fits this machine,
so the supervisor calls it on any backend and never asks which one it holds. Backends are
found by their `[cluster] backend` name in engine/launch/registry.py.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..config.problems import Problem
from ..config.schema import DevicesConfig, RunConfig
from ..hardware.devices import Inventory, discover_devices
from ..hardware.ledger import Ledger, MemoryLedger
from ..hardware.occupancy import OccupancyReader
from ..hardware.placement import ValidationPlan, plan_slots, plan_validation
from ..hardware.slots import Slot
from ..protocol.messages import Command, Event
from ..protocol.names import Intent
from ..protocol.spec import CHILD_MODULE, ChildSpec
from ..protocol.telemetry import TelemetrySnapshot
from .ports import take_port

RemotePids = Callable[[], dict[str, dict[str, int]]]  # {node id: {label: pid}} of the processes on other nodes
TelemetryHook = Callable[[TelemetrySnapshot], TelemetrySnapshot]  # adds other nodes' readings to a sample


class NoRoom(OSError):
    """A launch found no room for its attempt now (its node left the cluster, or did not answer in time): a
    backend raises it from `launch` or `rendezvous`, and a relaunch that meets it waits for room, spending no
    restart."""


@dataclass(frozen=True)
class LaunchSpec:
    """Where and how to start one child: its spec, its log, its GPU and any extra environment."""

    child: ChildSpec
    log_path: Path
    gpu_index: int | None  # its own GPU (as CUDA counts on its machine); None on CPU
    env: dict[str, str] = field(default_factory=dict)
    module: str = CHILD_MODULE
    node: str = ""  # the cluster node the scheduler placed it on (its slot's node); "" for this machine
    # A rank of a GPU gang: every rank's GPUs, in rank order. Each rank sees them all, as under torchrun,
    # and TORCHHERD_GPUS (LOCAL_RANK with one GPU a rank) says which are its own. () for a child alone.
    gang_gpus: tuple[int, ...] = ()
    own_gpus: tuple[int, ...] = ()  # its own GPUs when it holds several (gpus_per_rank); () : gpu_index alone
    gpu_share: float | None = None  # a fraction of its GPU (gpu_memory on a Ray cluster: num_gpus); None: whole

    @property
    def visible_gpus(self) -> tuple[int, ...]:
        """The GPUs its CUDA_VISIBLE_DEVICES names, in order: its gang's, else its own; () on CPU."""
        if self.gang_gpus:
            return self.gang_gpus
        if self.own_gpus:
            return self.own_gpus
        return () if self.gpu_index is None else (self.gpu_index,)

    @property
    def own_ordinals(self) -> tuple[int, ...]:
        """Its own GPUs as CUDA numbers them inside `visible_gpus` (TORCHHERD_GPUS); () on CPU."""
        own = self.own_gpus or (() if self.gpu_index is None else (self.gpu_index,))
        visible = self.visible_gpus
        return tuple(visible.index(g) for g in own if g in visible)


class Handle(ABC):
    """A running attempt (one child, or a gang of them) as the supervisor sees it, whatever launched it.

    The abstract methods are what every handle does; the attributes below have defaults that fit a
    child on this machine, and a handle that knows better sets them.
    """

    pid: int = 0  # the child's main process, as people see it (0 until a remote backend learns it)
    node: str = ""  # where it runs, for people: "" for this machine
    cause: Intent | None = None  # what the backend knows better than the exit code (NODE_LEFT), if anything
    failed_rank: int | None = None  # a gang's first rank to fail, the root cause (engine/launch/gang.py)

    @property
    def node_id(self) -> str:
        """The id of its node that telemetry asks that node's sampler by; default: `node`."""
        return self.node

    @property
    def pids(self) -> tuple[int, ...]:
        """Every process the backend started for it (their descendants are found by telemetry); empty while
        a remote backend does not know them yet."""
        return (self.pid,)

    @property
    def placed(self) -> tuple[tuple[str, str, int], ...]:
        """(node, node id, pid) of its process, or of each rank's for a gang (whose ranks may be on several
        nodes), for telemetry; pid 0 while a remote backend does not know it yet. Default: its one process."""
        pids = self.pids
        return ((self.node, self.node_id, pids[0] if pids else 0),)

    @abstractmethod
    def poll(self) -> int | None:
        """The exit status once it has exited (negative: ended by that signal), else None."""

    @abstractmethod
    def terminate(self) -> None:
        """Ask it to end now: it and its helpers (DataLoader workers) get the polite signal."""

    @abstractmethod
    def kill(self) -> None:
        """End it and its helpers at once."""

    @abstractmethod
    def dump_stacks(self) -> None:
        """Have it write every thread's stack to its log (for a hang)."""

    @abstractmethod
    def send(self, command: Command) -> bool:
        """Deliver a command; False if the child can no longer hear it."""

    @abstractmethod
    def attach(self, on_events: Callable[[list[Event]], None]) -> None:
        """Call `on_events` on the event loop whenever the child sends a batch."""

    @abstractmethod
    def drain(self) -> list[Event]:
        """Whatever the child sent that was not delivered yet (called after it exited)."""

    def read_waiting(self) -> None:
        """Deliver now, through `attach`'s callback, what the live child sent that waits unread (before its
        silence is judged). Default: nothing waits (a handle whose events arrive otherwise)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release its channels and reap stragglers of its process group."""


class Backend(ABC):
    """Where a session's attempts run: it launches them, offers the devices slots are planned on, says
    where validators and gangs' rendezvous go, and cleans up; see the module docstring."""

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> Handle:
        """Start one child; raises OSError if it cannot (the restart policy tries again later)."""

    def launch_ranks(self, specs: list[LaunchSpec]) -> list[Handle]:
        """Start every rank of one attempt of a gang, in rank order; if one cannot start, those already
        started are closed and the error raised. Default: `launch` each in turn, as each spec says which GPUs
        its rank sees (engine/launch/environment.py)."""
        started: list[Handle] = []
        try:
            for spec in specs:
                started.append(self.launch(spec))
        except BaseException:  # whatever went wrong, no rank may be left running
            for h in started:
                h.close()
            raise
        return started

    @cached_property
    def inventory(self) -> Inventory:
        """The devices attempts can be given. Default: this machine's, read once."""
        return discover_devices()

    def plan_slots(self, devices: DevicesConfig, inventory: Inventory, file: str = "",
                   fit: bool = False) -> tuple[list[Slot], list[Problem]]:
        """The slots `devices` asks for on `inventory`, or the problems that prevent it (naming `file`).

        With `fit` (the inventory changed under a running session) what it still holds of them, with no
        problems. Default: this machine's slots (engine/hardware/placement.py), which never change.
        """
        return plan_slots(devices, inventory, file)

    def plan_validation(self, config: RunConfig, slots: list[Slot], inventory: Inventory) -> ValidationPlan:
        """Where `config`'s validation runs. Default: one validator beside the workers, on a spare GPU or
        core when there is one (engine/hardware/placement.py)."""
        return plan_validation(config, slots, inventory)

    def ledger(self) -> MemoryLedger:
        """The books devices are granted from. Default: this user's ledger on this machine, shared with every
        other run of theirs here (engine/hardware/ledger.py)."""
        return Ledger()

    def occupancy(self) -> OccupancyReader | None:
        """What reads the foreign processes and free memory of the GPUs slots are planned on. Default: NVML
        on this machine."""
        return OccupancyReader()

    def hold_launches(self, queued: int, free: int) -> bool:
        """Before the scheduler starts any of `queued` waiting pipelines on `free` slots: True to hold them a
        while, as the backend is getting ready to start them faster (asked every supervision pass, so cheap).
        Default: never."""
        return False

    def expect_restarts(self) -> None:
        """The session's pipelines will start again and again (a sweep that pauses, promotes or exploits its
        trials, each restart from a checkpoint; called as it starts): get ready to start them faster.
        Default: nothing."""
        return None

    def rendezvous(self, node: str) -> tuple[str, int]:
        """MASTER_ADDR and a held MASTER_PORT (ports.release_port frees it) for a gang whose ranks all run
        on `node`. Default: this machine's loopback and a port free here."""
        return "127.0.0.1", take_port()

    def node_label(self, node: str) -> str:
        """A node's name for people (validator folders, notices). Default: "" (the caller shows the id)."""
        return ""

    def follow(self, max_age: float) -> int:
        """The generation of the backend's nodes, looked at again if the last look is older than `max_age`
        seconds; the supervisor plans its slots again when it changes. Default: 0, as a machine's
        devices never change under a session."""
        return 0

    def refresh(self) -> list[str]:
        """Look at which nodes are alive now; the labels of those that left since. Default: none left."""
        return []

    def remote_telemetry(self, pids: RemotePids) -> TelemetryHook | None:
        """A hook that adds other nodes' readings of `pids()` to each sample of this machine's sampler.
        Default: None, as every process runs here and the local sampler sees it."""
        return None

    def remove_roots(self, roots: dict[str, str]) -> None:
        """Remove the snapshot roots {node id: path} made on other nodes (blocking: called off the loop).
        Default: nothing, as this machine's root is the supervisor's to remove."""
        return None

    def close(self) -> None:
        """The session is over: release what the backend holds (sockets, ending actors). Default: nothing."""
        return None
