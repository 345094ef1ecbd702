"""What `check` says of the optional parts a config asks for before anything runs: Ray for a Ray cluster, the
trackers' clients for `[tracking]`, and the files of the user's own sinks."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from .problems import Problem
from .schema import RunConfig


def optional_problems(top: RunConfig, shown: str, base_dir: Path) -> list[Problem]:
    """An extra the config needs that is not installed (found without importing it), a sink file that is not there
    (a relative one is the config's folder's, as the sink host finds it)."""
    problems = []
    if top.cluster.backend == "ray" and importlib.util.find_spec("ray") is None:
        problems.append(Problem(shown, "cluster.backend", 'Ray is not installed: pip install "torchherd[ray]"'))
    problems += [Problem(shown, f"tracking.{key}", f'{key} is set but its client is not installed: pip install '
                         f'"torchherd[{key}]"')
                 for key in ("mlflow", "wandb") if getattr(top.tracking, key) and importlib.util.find_spec(key) is None]
    for i, spec in enumerate(top.tracking.sinks):
        target = spec.rpartition(":")[0]
        if target.endswith(".py") and not (base_dir / target).is_file():  # (an absolute target stays itself)
            problems.append(Problem(shown, f"tracking.sinks[{i}]", f"{base_dir / target}: file not found"))
    return problems
