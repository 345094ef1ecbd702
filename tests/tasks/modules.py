"""The tiny task, built after writing the modules its worker has loaded by then to `params["modules_file"]`."""
import json
import sys

from tiny import build as build_tiny  # noqa: E402  (the worker puts the task's folder on sys.path)


def build(params):
    with open(params["modules_file"], "w") as f:
        json.dump(sorted(sys.modules), f)
    return build_tiny({k: v for k, v in params.items() if k != "modules_file"})
