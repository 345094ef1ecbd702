"""A DDP gang on a Ray cluster: where its ranks meet (MASTER_ADDR and MASTER_PORT on their node).

The scheduler grants a gang all its slots on one node (engine/supervise/scheduler.py) and each
rank's actor is pinned to its slot's node with hard node affinity, so the ranks land
together as a STRICT_PACK placement group would put them, without one: a placement
group would be a second reservation to keep in step with the scheduler (which already
decides who starts when, and where) and one more Ray object to free when an attempt
ends or its node leaves. Rank 0's store listens on
the node's address (`ray.nodes()`' NodeManagerAddress) on a port found free there.
"""
from __future__ import annotations

import socket
from types import ModuleType

from .. import ports
from ..backend import NoRoom
from .placement import ClusterInventory

# Seconds a gang's launch waits for another node to name a free port: a 0-CPU task there, which
# takes a Ray worker's start (about a second) the first time and milliseconds after.
RENDEZVOUS_WAIT = 10.0
TRIES = 8  # ports a node may name that a live gang of this process holds already, before giving up


def free_port() -> int:
    """A TCP port free on every interface of the node this runs on (a Ray task on the gang's node)."""
    with socket.socket() as s:
        s.bind(("", 0))  # rank 0's store listens on every interface
        port: int = s.getsockname()[1]
    return port


def rendezvous(ray: ModuleType, inventory: ClusterInventory, driver_node: str, node: str) -> tuple[str, int]:
    """The node's address and a port free there, held (ports.release_port frees it when the attempt ends).

    On this process's own node the port is found here; on another, by a task there, waited for
    up to RENDEZVOUS_WAIT seconds once per gang attempt. Raises NoRoom (an OSError: the restart
    policy tries again later) if the node left or did not answer.
    """
    ip = next((n.ip for n in inventory.nodes if n.node_id == node), None)
    if ip is None:
        raise NoRoom(f"node {inventory.label(node)} of the gang's slots has left the cluster")
    if node == driver_node:
        return ip, ports.take_port()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(free_port)
    for _ in range(TRIES):
        ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
        try:
            port = int(ray.get(ref, timeout=RENDEZVOUS_WAIT))
        except Exception as exc:  # timed out, or the node died under it
            ray.cancel(ref, force=True)
            raise NoRoom(f"node {inventory.label(node)} did not name a port for the gang's rendezvous "
                         f"({type(exc).__name__})") from None
        if ports.hold_port(port):
            return ip, port
    raise NoRoom(f"no free TCP port on node {inventory.label(node)} for the gang's rendezvous")
