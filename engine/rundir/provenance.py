"""Which code a session runs: the git commit of the config's folder and of each task's or script's folder in
another repository, whether tracked files differed from it, and that diff saved in the run folder (cut at
MAX_DIFF bytes).

git is run with a short timeout and never as a repository's own config would have it run code (no hooks, no
fsmonitor, no external diff, textconv or filter); no git, or no repository, is one notice and nothing recorded.
"""
from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..config.schema import RunConfig
from ..protocol.messages import SourceCommit
from ..protocol.nolinks import LinkRefused, make_dirs, open_file

GIT_TIMEOUT = 5.0  # seconds each git command may take
MAX_DIFF = 1 << 20  # bytes of a dirty tree's diff kept in the run folder
FOLDER = "code"  # in the run folder: each dirty repository's diff
# What a repository's own config could make git run; `filter.<name>.*` are added for the filters it names.
SAFE = ("-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "diff.external=",
        "-c", "core.untrackedCache=false", "--no-optional-locks")


@dataclass(frozen=True)
class Provenance:
    """What the session's code was: its commits (the config's first) and what could not be read, said once."""

    commits: tuple[SourceCommit, ...]
    notice: str = ""


class GitFailed(Exception):
    """A git command failed, timed out, or is not there."""


def code_folders(configs: list[RunConfig]) -> dict[Path, bool]:
    """Each config's folder, then each task file's, script's or validate factory's folder, in order, once each:
    whether it holds code (a folder holding only a config does not: the run folder keeps a copy of the config)."""
    folders = {Path(config.source).resolve().parent: False for config in configs if config.source}
    for pipe in (pipe for config in configs for pipe in config.pipelines):
        target = pipe.task_ref.removeprefix("lightning:").rpartition(":")[0]
        for path in (target, pipe.script_ref, pipe.validate_ref.rpartition(":")[0]):
            if path.endswith(".py") and Path(path).is_absolute():
                folders[Path(path).parent] = True
    return folders


def record(configs: list[RunConfig], run_dir: Path) -> Provenance:
    """The commits of the code `configs` run, each dirty one's diff written under `run_dir`/code/ (blocking: call
    it off the event loop). The notice names the folders of code in no repository, or the configs' own when
    nothing at all could be recorded."""
    if shutil.which("git") is None:
        return Provenance((), "no git on PATH: the run records no commit of its code (said once)")
    found: dict[str, SourceCommit] = {}
    outside: list[tuple[str, bool]] = []  # (folder, and why git could not read it), whether it holds code
    for folder, code in code_folders(configs).items():
        if not folder.is_dir():
            continue
        try:
            top = _git(folder, "rev-parse", "--show-toplevel").decode().strip()
        except GitFailed:
            outside.append((str(folder), code))
            continue
        if top in found:
            continue
        try:
            found[top] = _commit(Path(top), run_dir)
        except GitFailed as exc:
            outside.append((f"{top} ({exc})", True))
    said = [folder for folder, code in outside if code or not found]
    notice = ""
    if said:
        verb, them = ("is", "it") if len(said) == 1 else ("are", "them")
        notice = (f"{', '.join(said)} {verb} in no git repository (or git could not read {them}): no commit "
                  f"recorded for {them} (said once)")
    return Provenance(tuple(found.values()), notice)


def _commit(top: Path, run_dir: Path) -> SourceCommit:
    commit = _git(top, "rev-parse", "--verify", "HEAD").decode().strip()
    filters = _filters(top)
    dirty = bool(_git(top, *filters, "status", "--porcelain", "--untracked-files=no", "--ignore-submodules=dirty"))
    if not dirty:
        return SourceCommit(repo=str(top), commit=commit)
    text = _git(top, *filters, "diff", "HEAD", "--no-ext-diff", "--no-textconv", "--no-color", "--binary",
                limit=MAX_DIFF + 1)
    cut = len(text) > MAX_DIFF
    name = _diff_name(run_dir, top.name or "repo")
    try:
        make_dirs(run_dir / FOLDER, run_dir)
        with open_file(run_dir / name, "wb") as out:
            out.write(text[:MAX_DIFF])
            if cut:
                out.write(f"\n# torchherd: the diff was cut at {MAX_DIFF} bytes\n".encode())
    except (LinkRefused, OSError):
        name = ""
    return SourceCommit(repo=str(top), commit=commit, dirty=True, diff=name, diff_cut=cut)


def _diff_name(run_dir: Path, repo: str) -> str:
    """code/REPO.diff, or code/REPO-2.diff ... when a session before this one (a resume) wrote it already."""
    stem, n = f"{FOLDER}/{repo}", 2
    name = f"{stem}.diff"
    while (run_dir / name).exists():
        name, n = f"{stem}-{n}.diff", n + 1
    return name


def _filters(top: Path) -> list[str]:
    """`-c` options that turn off every clean, smudge and process filter the repository's config names."""
    try:
        listed = _git(top, "config", "--name-only", "--get-regexp", r"^filter\.").decode().split()
    except GitFailed:  # none configured: git says so with status 1
        return []
    names = {key[len("filter."):].rpartition(".")[0] for key in listed}
    return [opt for name in sorted(names) for key in ("clean=", "smudge=", "process=", "required=false")
            for opt in ("-c", f"filter.{name}.{key}")]


def _git(folder: Path, *args: str, limit: int = 1 << 20) -> bytes:
    """git's output (at most `limit` bytes) for `args` in `folder`; GitFailed if it fails or takes too long."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # the folder names the repository
    env.update(GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
    try:
        proc = subprocess.Popen(["git", *SAFE, *args], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise GitFailed(str(exc)) from None
    try:
        out, err = _read(proc, limit)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if proc.returncode != 0 and len(out) < limit:
        said = err.decode(errors="replace").strip().splitlines()
        raise GitFailed(said[-1] if said else f"git {args[0]} exited {proc.returncode}")
    return out


def _read(proc: subprocess.Popen, limit: int) -> tuple[bytes, bytes]:
    """Up to `limit` bytes of `proc`'s stdout (it is killed once it has written that much) and the start of its
    stderr, within GIT_TIMEOUT; GitFailed when it takes longer."""
    deadline = time.monotonic() + GIT_TIMEOUT
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]  # PIPE: never None
        sel.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise GitFailed(f"git took over {GIT_TIMEOUT:g} s")
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data is out or len(err) < 1 << 16:
                    key.data.extend(chunk)
                if len(out) >= limit:
                    return bytes(out[:limit]), bytes(err)
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise GitFailed(f"git took over {GIT_TIMEOUT:g} s") from None
    return bytes(out), bytes(err)
