#!/usr/bin/env bash
# What CI runs before the tests: ruff, then mypy, over engine/, tui/ and torchherd/, both configured in
# pyproject.toml. mypy reads the code under its installed names (torchherd.engine, torchherd.tui): a tree of
# links in .mypy_cache/ maps the folders onto them, as pyproject's package-dir does. Non-zero on any finding.
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
ruff check engine tui torchherd
ruff_rc=$?
tree="$repo/.mypy_cache/tree"
rm -rf "$tree"
mkdir -p "$tree/torchherd"
for entry in "$repo"/torchherd/*; do  # its modules (and any sub-package), not its bytecode
    [ "$(basename "$entry")" = __pycache__ ] || ln -s "$entry" "$tree/torchherd/"
done
ln -s "$repo/engine" "$tree/torchherd/engine"
ln -s "$repo/tui" "$tree/torchherd/tui"
# Paths come back as the repository names them (engine/..., tui/...), so an editor can jump to them.
(cd "$tree" && mypy --config-file "$repo/pyproject.toml" --cache-dir "$repo/.mypy_cache" -p torchherd) \
    | sed -e 's#^torchherd/engine/#engine/#' -e 's#^torchherd/tui/#tui/#'
mypy_rc=${PIPESTATUS[0]}
if [ "$ruff_rc" -ne 0 ]; then exit "$ruff_rc"; fi
exit "$mypy_rc"
