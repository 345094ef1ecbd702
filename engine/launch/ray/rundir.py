"""The run directory on a cluster: every node must see the same folder at the same path.

Workers on other nodes write their logs, checkpoints and metrics into the run
directory and the supervisor reads them, so it has to live on a filesystem every
node mounts at one path (NFS, a parallel filesystem, or one machine). `check_shared`
proves it at start: this process writes a probe file, a tiny task on each node reads it
and writes its own, and this process reads those back. A node that cannot is named.

Snapshots are the exception: they stay in each node's own /dev/shm. `ensure_root` runs
on a node (in the actor that first needs the node's snapshot root) and `remove_roots`
frees them there at the end of the session.
"""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from ...config.problems import Problem
from ...rundir.snapshots import PID_FILE, _ours, claim_root, owner_alive, remove_root
from .placement import ClusterNode

PROBE_TIMEOUT = 60.0  # seconds for every node's probe task, worker start-up included
_checked: set[tuple[str, frozenset[str]]] = set()  # (folder, node ids) proved shared in this process


def visit(path: str, token: str, node_id: str) -> str:
    """On a node: read this process's probe and leave one of our own; "" or what went wrong."""
    try:
        seen = Path(path).read_text()
    except OSError as exc:
        return f"cannot read {path} there ({exc.strerror or exc})"
    if seen != token:
        return f"{path} there holds another file (the same path is a different folder on that node)"
    try:
        Path(f"{path}.{node_id}").write_text(token)
    except OSError as exc:
        return f"cannot write beside {path} there ({exc.strerror or exc})"
    return ""


def check_shared(folder: Path, nodes: list[ClusterNode], file: str = "") -> list[Problem]:
    """Problems (under `runs_dir`) for every node that does not share `folder` with this process."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folder = folder.resolve()
    key = (str(folder), frozenset(n.node_id for n in nodes))
    if key in _checked:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    probe = folder / f".torchherd-probe-{token}"
    probe.write_text(token)
    task = ray.remote(num_cpus=0, max_retries=0)(visit)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
            .remote(str(probe), token, n.node_id) for n in nodes]
    problems = []
    try:
        answers = ray.get(refs, timeout=PROBE_TIMEOUT)
    except Exception as exc:  # GetTimeoutError, a node dying under us
        answers = [f"its probe task did not answer ({type(exc).__name__})"] * len(nodes)
    for node, why in zip(nodes, answers):
        theirs = Path(f"{probe}.{node.node_id}")
        if not why and not theirs.exists():
            why = "its probe file did not appear here"
        if why:
            problems.append(Problem(file, "runs_dir", (
                f"node {node.label} does not share the run directory {folder}: {why}; every node of the "
                "cluster must see it at the same path (a shared filesystem such as NFS)")))
        try:
            theirs.unlink()
        except OSError:
            pass
    try:
        os.unlink(probe)
    except OSError:
        pass
    if not problems:
        _checked.add(key)
    return problems


def ensure_root(path: str, own: bool = False) -> None:
    """On a node: make the snapshot root `path` there, private and marked, unless an actor of this run
    already did. With `own` (the node's validator, which lives the whole session), or when its owner
    has died, this process becomes its owner: stale cleanup frees a root whose owner died.

    Two actors may start on a node at once: the root is made under a private name and renamed into
    place, so one wins whole and the other finds it ready. OSError when `path` is not ours.
    """
    root = Path(path)
    if not root.exists():
        staging = root.with_name(f".{root.name}.{os.getpid()}.{secrets.token_hex(4)}")
        claim_root(staging)
        try:
            os.rename(staging, root)
        except OSError:  # another actor's rename won (the root is no longer empty)
            shutil.rmtree(staging, ignore_errors=True)
    if not _ours(root):
        raise OSError(f"{root} exists on this node but is not a snapshot folder of this user's torchherd")
    if not own and owner_alive(root):
        return
    fresh = root / f".{PID_FILE}.{os.getpid()}"
    fresh.write_text(f"{os.getpid()}\n")
    os.replace(fresh, root / PID_FILE)


def drop_root(path: str) -> None:
    """On a node: delete a snapshot root ensure_root made (anything else there is left alone)."""
    remove_root(Path(path))


def remove_roots(roots: dict[str, str], timeout: float = 10.0) -> None:
    """Delete the snapshot roots, {node id: path}, each on its node; a node gone took its own with it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(drop_root)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(path)
            for node, path in roots.items()]
    try:
        ray.get(refs, timeout=timeout)
    except Exception:  # a node that left, or one too slow: its /dev/shm is no longer ours to free
        pass
