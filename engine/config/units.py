"""Amounts a config states in units people write: GPU memory as '6GiB', '512MiB' or '8GB'."""
from __future__ import annotations

import re

MEMORY_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
                "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def memory_bytes(text: str) -> int:
    """'6GiB', '512 MiB', '8GB' as bytes; ValueError naming what is wrong."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in MEMORY_UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"must be an amount like '6GiB', '512MiB' or '8GB', or a fraction like 0.25 (got {text!r})")
    return int(float(match.group(1)) * MEMORY_UNITS[unit])
