"""Alerts from a real run: a loss that turns NaN under nan_policy "warn" raises one `alert` (not one per
report), an out-of-memory crash one, and each runs the configured command once, argv with its placeholders
filled, its output in alerts.log; a webhook gets the alert as JSON, and one that refuses costs the run nothing."""
from __future__ import annotations

import asyncio
import http.server
import json
import socket
import sys
import threading
from pathlib import Path

import pytest

from torchherd.engine.protocol.health import Alert
from torchherd.engine.protocol.messages import Notice, StepMetrics
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import wait_for
from tests.faults.support import faulty_config, finish, poll_until, supervised

pytestmark = pytest.mark.slow

WRITE = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '|' + sys.argv[3] + '\\n'); print('told')"


async def test_a_nan_loss_and_an_oom_crash_are_one_alert_each_and_one_run_of_the_command_each(tmp_path):
    told = tmp_path / "told.txt"
    cfg = faulty_config(tmp_path, [
        {"name": "a", "nan_policy": "warn", "params": {"samples": 256, "fault": "nan", "fault_at_call": 3}},
        {"name": "b", "params": {"samples": 256, "fault": "oom", "fault_at_call": 3,
                                 "once_file": str(tmp_path / "oom-once")}}],
        defaults={"max_epochs": 2}, validation={"mode": "off"}, restart={"min_uptime": 0.0},
        alerts={"command": [sys.executable, "-c", WRITE, str(told), "{rule}", "{title}"]})
    sup = Supervisor(cfg)
    async with supervised(sup):
        assert await finish(sup) == {"a": "completed", "b": "completed"}  # b restarted after its OOM
    alerts = [e for e in read_events(sup.run_dir) if isinstance(e, Alert)]
    # every report of a is NaN, and b's error and its exit both say out of memory: one alert each
    assert sorted((a.rule, a.pipeline, a.count) for a in alerts) == [("nan", "a", 1), ("oom", "b", 1)]
    await asyncio.to_thread(poll_until, lambda: told.exists() and len(told.read_text().splitlines()) == 2, 30,
                            "the alert command's two lines")
    assert sorted(told.read_text().splitlines()) == ["nan|a: loss is not finite", "oom|b: out of memory"]
    assert (sup.run_dir / "alerts.log").read_text().splitlines().count("told") == 2  # the commands' output


class Hook(http.server.BaseHTTPRequestHandler):
    """A local webhook: keeps every body POSTed to it."""

    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        Hook.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:  # nothing on the test's stderr
        pass


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("refusing", [False, True])
async def test_the_webhook_gets_the_alert_as_json_and_a_refusing_one_costs_the_run_nothing(tmp_path, refusing):
    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Hook.bodies = []
    port = closed_port() if refusing else server.server_address[1]
    cfg = faulty_config(tmp_path, [{"name": "a", "nan_policy": "warn", "max_epochs": 1000,
                                    "params": {"samples": 256, "delay": 0.002, "fault": "nan", "fault_at_call": 3}}],
                        validation={"mode": "off"}, alerts={"webhook": f"http://127.0.0.1:{port}/hook"})
    sup = Supervisor(cfg)
    try:
        async with supervised(sup) as stream:
            if refusing:  # three tries, then one notice; training goes on meanwhile
                await wait_for(stream, lambda e: isinstance(e, Notice) and "the alert webhook" in e.text, 60)
                await wait_for(stream, lambda e: isinstance(e, StepMetrics), 60)
            else:
                await asyncio.to_thread(poll_until, lambda: Hook.bodies, 60, "the webhook's POST")
            sup.stop()
            assert await finish(sup) == {"a": "stopped"}
    finally:
        server.shutdown()
    notices = [e for e in read_events(sup.run_dir) if isinstance(e, Notice) and "the alert webhook" in e.text]
    if refusing:
        assert len(notices) == 1 and Hook.bodies == []
    else:
        [body] = Hook.bodies
        assert (body["type"], body["rule"], body["pipeline"], body["run"]) == ("alert", "nan", "a", sup.run_id)
        assert notices == []


async def test_a_running_pipeline_whose_gpu_sits_idle_is_one_alert_and_one_run_of_the_command(tmp_path, fake_nvml):
    # The fake NVIDIA driver lists the worker's pid on gpu0 at 0% utilisation; the pipeline trains on a CPU slot
    # (this torch may have no CUDA), held at a gate so it runs for as long as the test needs.
    from tests.nvml_fake import FakeGpu, GiB
    from torchherd.engine.protocol.messages import WorkerStarted

    fake_nvml.gpus = [FakeGpu(util_gpu=0)]
    fake_nvml.write()
    told, gate = tmp_path / "told.txt", tmp_path / "gate"
    cfg = faulty_config(tmp_path, [{"name": "a", "params": {"samples": 640, "gate_file": str(gate), "gate_at_call": 3}}],
                        defaults={"max_epochs": 1}, devices={"placement": "cpu", "cpu_slots": 1},
                        validation={"mode": "off"}, telemetry={"interval": 0.05, "persist_every": 0.05},
                        alerts={"idle_minutes": 0.01, "command": [sys.executable, "-c", WRITE, str(told), "{rule}",
                                                                  "{title}"]})
    sup = Supervisor(cfg)
    async with supervised(sup) as stream:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "a")
        fake_nvml.gpus[0].processes = [(started.pid, 2 * GiB)]
        fake_nvml.write()
        alert = await wait_for(stream, lambda e: isinstance(e, Alert) and e.rule == "idle")
        assert alert.pipeline == "a" and "0% of the time" in alert.message
        gate.touch()
        assert await finish(sup) == {"a": "completed"}
    assert [(e.rule, e.pipeline) for e in read_events(sup.run_dir) if isinstance(e, Alert)] == [("idle", "a")]
    await asyncio.to_thread(poll_until, lambda: told.exists() and told.read_text().strip(), 30, "the command's line")
    assert told.read_text().splitlines() == ["idle|a: GPU idle"]


# Regression: a script's NaN alert said "at epoch 0 step 1" while the table showed epoch 1.
async def test_a_scripts_nan_names_its_epoch_as_the_table_counts_it(tmp_path):
    from tests.conftest import make_config

    script = tmp_path / "nan_loop.py"
    script.write_text("print('Epoch 1, Loss: nan', flush=True)\n")
    cfg = make_config(tmp_path, [{"name": "s", "script": str(script), "nan_policy": "warn",
                                  "metrics": r"Epoch (?P<epoch>\d+), Loss: (?P<loss>\S+)"}],
                      validation={"mode": "off"})
    sup = Supervisor(cfg)
    async with supervised(sup):
        await finish(sup)
    said = {e.text for e in read_events(sup.run_dir) if isinstance(e, Notice) and "training loss is" in e.text}
    assert said == {"training loss is nan at epoch 1 step 1"}, said


SPIKY = str(Path(__file__).parent / "tasks" / "scripts" / "spiky_loop.py")


# Regression: the same hard batch at step 100 of each epoch of a healthy script raised a loss spike alert, with the
# bell, in every run; a loss that jumped and stayed up alerted on each report (interval 0).
async def test_a_recurring_outlier_batch_raises_no_spike_and_a_diverging_loss_raises_one(tmp_path):
    from tests.conftest import make_config

    metrics = r"epoch (?P<epoch>\d+) step (?P<step>\d+) loss (?P<loss>\S+)"
    cfg = make_config(tmp_path, [
        {"name": "outlier", "script": SPIKY, "metrics": metrics, "args": ["--epochs", "3", "--outlier-at", "100"]},
        {"name": "diverging", "script": SPIKY, "metrics": metrics, "args": ["--epochs", "3", "--diverge-at", "200"]}],
        validation={"mode": "off"}, alerts={"interval": 0.0})
    sup = Supervisor(cfg)
    async with supervised(sup):
        assert await finish(sup) == {"outlier": "completed", "diverging": "completed"}
    events = read_events(sup.run_dir)
    hard = [e.step for e in events if isinstance(e, StepMetrics) and e.pipeline == "outlier" and e.loss > 4]
    assert hard == [100, 250, 400]  # the hard batch was seen, each epoch
    alerts = [e for e in events if isinstance(e, Alert)]
    assert [(a.rule, a.pipeline) for a in alerts] == [("spike", "diverging")], [a.message for a in alerts]
    assert " at step 200 " in alerts[0].message and "to step 202" in alerts[0].message, alerts[0].message
