"""Fuzz torchherd's edges for longer than the test suite does: the properties of tests/test_fuzz.py (control socket
frames and requests, worker channel batches, script client frames, configs, run folders) and tests/test_fuzz_records.py
(every field of every record, read back, exported and printed) with many more examples.

    python scripts/fuzz.py [--examples 20000] [-k EXPRESSION] [--seed N]

The suite runs each property with FUZZ_EXAMPLES=40; this sets it to --examples and runs them all (or those
-k selects) with pytest, printing hypothesis's statistics. A failure prints the smallest input that breaks a
property; add it to the test as an @example so the suite keeps it fixed. Exits with pytest's status.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000, help="examples a property (default 20000)")
    parser.add_argument("-k", default="", help="pytest -k: only the properties it selects")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis's seed, to repeat a run")
    args = parser.parse_args()
    env = {**os.environ, "FUZZ_EXAMPLES": str(args.examples)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=0",
               "--hypothesis-show-statistics", str(REPO / "tests" / "test_fuzz.py"),
               str(REPO / "tests" / "test_fuzz_records.py")]
    if args.k:
        command += ["-k", args.k]
    if args.seed is not None:
        command += [f"--hypothesis-seed={args.seed}"]
    return subprocess.call(command, cwd=REPO, env=env)


if __name__ == "__main__":
    sys.exit(main())
