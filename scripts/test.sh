#!/usr/bin/env bash
# The whole suite: every test but Ray's on two xdist workers (test by test; a file whose tests share one
# module-scoped run stays on one worker: its xdist_group mark), then the Ray tests one file at a time (each
# starts a cluster of its own). Both tiers always run; exits with the first tier's failure code, else the
# second's, so a failure in either fails the command. Extra arguments go to both pytest runs.
cd "$(dirname "$0")/.."
python -m pytest -q -n 2 --dist loadgroup -m "not ray" "$@"
first=$?
python -m pytest -q -m ray "$@"
second=$?
if [ "$first" -ne 0 ]; then exit "$first"; fi
exit "$second"
