"""`torchherd exporter`: Prometheus metrics of every live run of the user on this box, read by prometheus-client's
own parser from a real exporter process while real runs train: steps grow between scrapes, a run started later
comes in, one that ended drops out, the ledger's leases show, and it listens on 127.0.0.1 unless told otherwise."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TASKS, repo_env, service_of, still_alive

pytestmark = pytest.mark.slow
PLAIN = TASKS / "scripts" / "plain_loop.py"
WAIT = 60.0  # seconds a condition may take on a loaded machine


def start_run(folder: Path, runtime: Path, names: list[str]) -> Path:
    """A detached run of plain_loop pipelines, one CPU slot each, granted from a device ledger of its own (a 2-core
    box has CPU slots for one run only); its run directory."""
    folder.mkdir()
    body = "".join(f'[[pipelines]]\nname = "{n}"\nscript = "{PLAIN}"\nargs = ["--epochs", "100000", "--delay", '
                   '"0.1"]\nmetrics = \'Epoch (?P<epoch>\\d+), Loss: (?P<loss>\\S+)\'\n' for n in names)
    (folder / "run.toml").write_text(f'name = "ex-{uuid.uuid4().hex[:6]}"\n{body}[devices]\nplacement = "cpu"\n'
                                     f"cpu_slots = {len(names)}\n[telemetry]\nenabled = false\n")
    done = subprocess.run([sys.executable, "-m", "torchherd", "run", "run.toml", "--detach"], cwd=folder,
                          capture_output=True, text=True, env=repo_env(XDG_RUNTIME_DIR=str(runtime),
                                                                         TORCHHERD_LEDGER=str(folder / "ledger")),
                          stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    [run_dir] = list((folder / "runs").iterdir())
    return run_dir


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """metric name -> {its labels' values, in the order of their names: value}, parsed by prometheus-client."""
    with urllib.request.urlopen(url, timeout=30) as reply:
        text = reply.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(v for _, v in sorted(sample.labels.items()))] = sample.value
    return out


def scrape_until(url: str, holds, what: str) -> dict[str, dict[tuple, float]]:
    deadline = time.monotonic() + WAIT
    while True:
        metrics = scrape(url)
        if holds(metrics):
            return metrics
        assert time.monotonic() < deadline, f"{what}: {metrics}"
        time.sleep(0.2)  # the next scrape: polling a condition, not timing one


def steps(metrics: dict, run: Path) -> dict[str, float]:
    return {pipe: v for (pipe, r), v in metrics.get("torchherd_pipeline_step", {}).items() if r == run.name}


def stop(run_dir: Path, runtime: Path) -> None:
    service = service_of(run_dir)
    subprocess.run([sys.executable, "-m", "torchherd", "kill", str(run_dir)], capture_output=True,
                   env=repo_env(XDG_RUNTIME_DIR=str(runtime)), timeout=120)
    assert still_alive([service.pid], timeout=WAIT) == []


def test_the_exporter_serves_each_live_runs_figures_and_follows_runs_coming_and_going(tmp_path, private_runtime):
    from torchherd.engine import run_held
    from torchherd.engine.hardware.ledger import Lease, Ledger

    exporter = subprocess.Popen([sys.executable, "-m", "torchherd", "exporter", "--port", "0"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=repo_env(XDG_RUNTIME_DIR=str(private_runtime)))
    runs: list[Path] = []
    ledger = Ledger()
    try:
        first = exporter.stdout.readline()
        assert first.startswith("torchherd exporter: serving http://127.0.0.1:"), first + exporter.stderr.read()
        url = first.split()[3]
        listening = psutil.Process(exporter.pid).net_connections(kind="inet")
        assert {c.laddr.ip for c in listening if c.status == psutil.CONN_LISTEN} == {"127.0.0.1"}
        with ledger.locked():  # a lease another run of the user's holds on this box
            ledger.take([Lease("gpu3", "elsewhere", "big", rank=1, memory=2 << 30, pid=os.getpid())])
        runs += [start_run(tmp_path / "a", private_runtime, ["p", "q"]),
                 start_run(tmp_path / "b", private_runtime, ["r"])]
        moving = scrape_until(url, lambda m: all(len(steps(m, r)) == n and all(steps(m, r).values())
                                                 for r, n in zip(runs, (2, 1))), "every pipeline stepping")
        assert moving["torchherd_pipeline_state"][("p", runs[0].name, "running")] == 1
        assert moving["torchherd_pipeline_state"][("p", runs[0].name, "queued")] == 0
        assert ("r", runs[1].name) in moving["torchherd_pipeline_train_loss"]
        assert moving["torchherd_pipeline_device"][("cpu0", "r", runs[1].name)] == 1
        assert moving["torchherd_pipeline_ranks"][("r", runs[1].name)] == 1
        held = ("gpu3", "big", "1", "elsewhere")  # device, pipeline, rank, run
        assert moving["torchherd_ledger_lease"] == {held: 1}
        assert moving["torchherd_ledger_lease_memory_bytes"] == {held: 2 << 30}
        before = {r: steps(moving, r) for r in runs}
        scrape_until(url, lambda m: all(steps(m, r)[p] > before[r][p] for r in runs for p in before[r]),
                     f"every step past {before}")
        runs.append(start_run(tmp_path / "c", private_runtime, ["s"]))  # the exporter is not restarted
        scrape_until(url, lambda m: steps(m, runs[2]).get("s", 0) > 0, "the later run stepping")
        stop(runs[1], private_runtime)
        gone = scrape_until(url, lambda m: steps(m, runs[1]) == {}, "the ended run dropping out")
        assert set(steps(gone, runs[0])) == {"p", "q"}
        exporter.send_signal(signal.SIGINT)  # Ctrl-C
        assert exporter.wait(timeout=WAIT) == 0 and exporter.stderr.read() == ""
    finally:
        ledger.close()
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait()
        for run in runs:
            if run_held(run):
                stop(run, private_runtime)


def test_a_port_in_use_or_no_port_is_one_line_and_exit_2(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for arg, said in ((port, f"cannot listen on 127.0.0.1:{port}: Address already in use"),
                          ("http", "--port 'http': not a port (a number from 0 to 65535)")):
            done = subprocess.run([sys.executable, "-m", "torchherd", "exporter", "--port", arg], capture_output=True,
                                  text=True, env=repo_env(), stdin=subprocess.DEVNULL, timeout=120)
            assert (done.returncode, done.stdout, done.stderr) == (2, "", f"torchherd exporter: {said}\n")
