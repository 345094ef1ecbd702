"""What the GPU tests share: they run only where torch sees a CUDA device, and say how many they need.

A GPU test module starts with `pytestmark = [pytest.mark.gpu, pytest.mark.slow, NO_CUDA]`: on a machine
without CUDA `python -m pytest -m gpu` reports each test skipped with "CUDA not available", and the
default runs skip them too.
"""
from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()
NO_CUDA = pytest.mark.skipif(not CUDA, reason="CUDA not available")


def gpu_count() -> int:
    """The CUDA devices torch sees here (0 without CUDA)."""
    return torch.cuda.device_count() if CUDA else 0


def needs_gpus(n: int) -> pytest.MarkDecorator:
    """Skip where CUDA is there but with fewer than `n` GPUs (without CUDA: "CUDA not available")."""
    return pytest.mark.skipif(CUDA and gpu_count() < n, reason=f"needs {n} GPUs, this machine has {gpu_count()}")

