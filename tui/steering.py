"""How a script pipeline can be steered, for the words a key's notification uses.

A script without torchherd.client cannot checkpoint on request, and a stop is its stop signal (at
once, or after its next save): the dashboard says so when the key is pressed, rather than promise
what only the client can do. Read from the run's config.json and the script's source, once a pipeline.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class ScriptSteering:
    """What a script pipeline obeys: torchherd.client's requests, or only its stop signal."""

    client: bool  # the script (or a module beside it) imports torchherd.client
    stop_signal: str = "SIGINT"
    stop_mode: str = "signal"  # "signal": at once; "after_checkpoint": after its next save


@lru_cache(maxsize=256)
def script_steering(run_dir: Path, name: str) -> ScriptSteering | None:
    """`name`'s steering if it is a script pipeline of the run in `run_dir`, else None (a Task or Lightning
    pipeline obeys every command itself)."""
    from ..engine import uses_client

    try:
        configs = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for config in configs if isinstance(configs, list) else [configs]:
        for pipe in config.get("pipelines", []) if isinstance(config, dict) else []:
            if isinstance(pipe, dict) and pipe.get("name") == name:
                if not pipe.get("script"):
                    return None
                script = Path(pipe.get("script_ref") or pipe["script"])
                return ScriptSteering(client=uses_client(script), stop_signal=pipe.get("stop_signal", "SIGINT"),
                                      stop_mode=pipe.get("stop_mode", "signal"))
    return None
