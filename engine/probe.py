"""Task preflight: build every pipeline's task in a fresh interpreter and report what fails.

`probe_tasks(config)` runs `python -m torchherd.engine.probe` so user code never runs (or
prints) in the supervisor's process, and returns one Problem per broken pipeline.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from torchherd.engine.config import Problem, RunConfig
from torchherd.engine.launcher import python_module_command



def probe_tasks(config: RunConfig, timeout: float = 180.0, background: bool = False) -> list[Problem]:
    """Problems found building each distinct (task, params) of `config`; empty if all build.

    `background`: validation runs in the background, so a Lightning callback or scheduler
    that monitors a validation metric inside the worker is a problem too.
    """
    jobs = []
    seen = set()
    for i, p in enumerate(config.pipelines):
        key = (p.task_ref or p.task, json.dumps(p.params, sort_keys=True),
               p.datamodule, json.dumps(p.datamodule_params, sort_keys=True))
        if key in seen:
            continue
        seen.add(key)
        job = {"index": i, "ref": key[0], "params": p.params}
        if p.kind == "lightning":
            job.update(lightning=True, datamodule=p.datamodule, datamodule_params=p.datamodule_params,
                       background=background)
        jobs.append(job)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(python_module_command("torchherd.engine.probe"), input=json.dumps(jobs), env=env,
                              capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return [Problem(config.source, "pipelines", f"building the tasks took longer than {timeout:g}s")]
    results = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("TORCHHERD-PROBE "):
            results = json.loads(line[len("TORCHHERD-PROBE "):])
            break
    if results is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return [Problem(config.source, "pipelines", "building the tasks crashed: " + " | ".join(tail))]
    problems = []
    for r in results:
        if r["error"]:
            i = r["index"]
            where = f"pipelines[{i}].task"
            problems.append(Problem(config.source, where, r["error"]))
    return problems


def _main() -> None:
    jobs = json.loads(sys.stdin.read())
    import torch

    from torchherd.engine.task import TaskError, build_task

    torch.set_num_threads(1)
    out = []
    for job in jobs:
        try:
            if job.get("lightning"):
                _probe_lightning(job)
            else:
                build_task(job["ref"], job["params"])
            out.append({"index": job["index"], "error": ""})
        except TaskError as exc:
            out.append({"index": job["index"], "error": str(exc)})
        except Exception as exc:
            out.append({"index": job["index"], "error": f"{type(exc).__name__}: {exc}"})
    print("TORCHHERD-PROBE " + json.dumps(out), flush=True)


def _probe_lightning(job: dict) -> None:
    """Build the module and DataModule (no data, no Trainer: Lightning's import is the cost already)."""
    from torchherd.engine.lightning_support import build_lightning, monitors_problem, val_monitors
    from torchherd.engine.task import TaskError

    task = build_lightning(job["ref"], job["params"], job["datamodule"], job["datamodule_params"])
    if job["background"]:
        found = val_monitors(task)
        if found:
            raise TaskError(monitors_problem(found))


if __name__ == "__main__":
    _main()
