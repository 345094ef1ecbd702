#!/usr/bin/env bash
# Smoke test of the app in tmux at 80x24 and 120x40: launch a config from the picker with send-keys,
# kill and restart its pipeline from the keyboard, quit (stopping it gracefully), and check that
# no process is left and that the terminal was told where the run directory is. Uses its own tmux server socket, so it never touches your sessions.
# Usage: scripts/tmux_smoke.sh [CONFIG]   (default: a generated long-running tiny CPU config; with CONFIG,
# its first pipeline is the one killed and restarted)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
[ -x "$ROOT/../venv/bin/python" ] && [ -z "${PYTHON:-}" ] && PY="$ROOT/../venv/bin/python"
[ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && PY="$ROOT/.venv/bin/python"
SOCKET="torchherd-smoke-$$"
WORK="$(mktemp -d)"
TIMEOUT="${SMOKE_TIMEOUT:-90}"  # seconds to wait for any one screen

cleanup() {
    tmux -L "$SOCKET" kill-server 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ $# -ge 1 ]; then
    CONFIG="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
else
    CONFIG="$WORK/smoke.toml"
    cat > "$CONFIG" <<'EOF'
# One tiny CPU pipeline that trains far longer than the smoke test runs, so it is alive to kill.
name = "smoke"

[[pipelines]]
name = "smoke"
task = "regression"
max_epochs = 10000
params = { samples = 256, features = 4, hidden = 8 }

[devices]
placement = "cpu"
cpu_slots = 1
EOF
fi

PIPE="$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["pipelines"][0]["name"])' "$CONFIG")"

fail() { echo "FAIL ($SIZE): $*" >&2; echo "--- screen ---" >&2; screen_text >&2 || true; exit 1; }
screen_text() { tmux -L "$SOCKET" capture-pane -p -t smoke 2>/dev/null; }

wait_for() {  # wait_for REGEX WHAT: poll the screen until it matches
    local deadline=$((SECONDS + TIMEOUT))
    until screen_text | grep -Eq "$1"; do
        [ $SECONDS -lt $deadline ] || fail "timed out waiting for $2"
        sleep 0.5
    done
}

worker_pids() {  # every worker pid the run directory has recorded
    cat "$RUNS"/*/events.jsonl 2>/dev/null | grep '"type":"worker_started"' |
        sed -E 's/.*"pid":([0-9]+).*/\1/' | sort -u
}

wait_for_count() {  # wait_for_count N WHAT: until N worker starts are recorded
    local deadline=$((SECONDS + TIMEOUT))
    until [ "$(worker_pids | wc -l)" -ge "$1" ]; do
        [ $SECONDS -lt $deadline ] || fail "timed out waiting for $2"
        sleep 0.5
    done
}

run_size() {
    SIZE="$1"; local term="$2"
    local cols="${SIZE%x*}" rows="${SIZE#*x}"
    RUNS="$WORK/runs-$SIZE"
    local rc_file="$WORK/rc-$SIZE"
    echo "== $SIZE (TERM=$term)"
    tmux -L "$SOCKET" -f /dev/null new-session -d -s smoke -x "$cols" -y "$rows" \
        "cd '$ROOT' && TERM=$term PYTHONPATH='$ROOT' '$PY' -c 'import sys; from pathlib import Path; \
from torchherd.tui.app import run_app; sys.exit(run_app(Path(sys.argv[1]), Path(sys.argv[2])))' '$CONFIG' '$RUNS'; \
echo \$? > '$rc_file'; sleep 600"

    wait_for "ready: enter launches" "the picker's check"
    tmux -L "$SOCKET" send-keys -t smoke Enter
    wait_for "$PIPE +(cpu[0-9]* +)?running" "$PIPE running"
    wait_for_count 1 "the first worker"

    tmux -L "$SOCKET" send-keys -t smoke k
    wait_for "Kill" "the kill confirmation"
    tmux -L "$SOCKET" send-keys -t smoke y
    wait_for "$PIPE +(cpu[0-9]* +)?killed" "$PIPE killed"

    local before; before=$(worker_pids | wc -l)
    tmux -L "$SOCKET" send-keys -t smoke r
    wait_for_count $((before + 1)) "a new worker after restart"
    wait_for "$PIPE +(cpu[0-9]* +)?running" "$PIPE running again"

    tmux -L "$SOCKET" send-keys -t smoke q
    local deadline=$((SECONDS + TIMEOUT))  # the quit dialog, or the exit if nothing is alive any more
    until [ -s "$rc_file" ] || screen_text | grep -q "still running"; do
        [ $SECONDS -lt $deadline ] || fail "neither the quit dialog nor an exit"
        sleep 0.5
    done
    [ -s "$rc_file" ] || tmux -L "$SOCKET" send-keys -t smoke s
    deadline=$((SECONDS + TIMEOUT))
    until [ -s "$rc_file" ]; do
        [ $SECONDS -lt $deadline ] || fail "the app did not exit"
        sleep 0.5
    done
    [ "$(cat "$rc_file")" = "0" ] || fail "the app exited with status $(cat "$rc_file")"
    wait_for "run directory: $RUNS/" "the run directory printed after the app exited"

    local left=""
    for pid in $(worker_pids); do
        if kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != "Z" ]; then
            left="$left $pid"
        fi
    done
    [ -z "$left" ] || fail "workers left running:$left"
    grep -q '"type":"pipeline_finished"' "$RUNS"/*/events.jsonl || fail "no pipeline_finished recorded"
    tmux -L "$SOCKET" kill-session -t smoke
    echo "ok: launched, killed, restarted, quit; $(worker_pids | wc -l) workers started, none left"
}

run_size 80x24 screen-256color
run_size 120x40 tmux-256color
echo "tmux smoke: all sizes passed"
